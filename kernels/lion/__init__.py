"""Triton kernels for LION / two-scan attention: flash-style masked form and chunked bidirectional scan."""
