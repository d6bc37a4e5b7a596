"""One tester per kernel family (XNNPACK's `*-microkernel-tester.h` habit): every variant of the
family goes through it, so compiling the tile, running it natively or emulated, the plain numpy
reference and the tolerance are written once, and a test says only which case it runs.

    f32_gemm.GemmTester   FP32 GEMM tiles (every ISA, MR x NR, beta=0)
    int_mac.MacTester     integer NEON tiles (s16 mac, s8 dot)
    f32_wino.WinoTester   Winograd transforms
    f32_dwconv.DwTester   depthwise rows
"""
