"""Running code this host cannot: ARM modules under qemu-user (qemu), x86 modules on the Bochs
CPU (bochs, for AVX-512 on hosts without it), each through a small C harness of its own."""
