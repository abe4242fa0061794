"""What both ends of the wire speak, shipped by the client and the server
distributions alike: the chunk parser (wire), the dtype table (dtypes), the
delta codec (delta, delta_kernels), reading safetensors files (sources) and
the optional dependencies they import on demand (extras).

The server depends on these, never on the client's internals; the client's
old paths (its modules of the same names) are deprecated aliases of them."""
