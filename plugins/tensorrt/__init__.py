"""trtfuse's ops registered with TensorRT, in one place: everything that speaks TensorRT's plugin interfaces.

* `contract`: every answer a plugin gives TensorRT (shapes, formats, tactics, AOT PTX and launch), plain Python,
  tested without TensorRT;
* `qdp`: the Quickly Deployable Plugins (`tensorrt.plugin`: register / autotune / aot_impl / impl);
* `v3`: the Python IPluginV3 plugins and their creators (full or lean runtime).

Why the name `tensorrt` does not shadow NVIDIA's module: Python 3 imports are absolute unless written with dots, so
`import tensorrt` anywhere (here included) finds the top-level `tensorrt` on sys.path, never this subpackage, which
is only reachable as `trtfuse.plugins.tensorrt`. The one way to shadow it would be to put the plugins/ folder itself
on sys.path (run a file of plugins/ as a script, or Python from inside plugins/): no file of plugins/ is a script,
and tests/test_code_layout.py checks both that and that every import of this subpackage is absolute. Importing this
package imports no TensorRT: its modules import it when they are called.
"""
