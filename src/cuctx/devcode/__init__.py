"""What device code says of itself, read without a driver: which kind of input a piece of
device code is (cubin, fatbin, PTX, LTO-IR, NVVM IR, host object, library), the kernels of a
cubin or PTX image with their parameter layouts, resources and variables, the parameter types
PTX declares, and whether a sim twin can stand for a kernel.

The bottom of the kernel stack: `cuctx.kernels` and the sim (`cuctx._driver.sim`) both read
device code through it, and it imports nothing of cuctx, so the driver seam stays below
`kernels/` and `memory/`. See docs/compiler.md."""
