"""No n × n array: 04's forward, 07's backward and 12's block_mask measured against Theorem 1's O(n)
extra memory, with tracemalloc (checks.peak_bytes), at a size where one such array would show."""
from checks import peak_bytes

SQUARE_N = 2048  # n: one float64 n × n array is 32 MiB, a bool one 4 MiB
SQUARE_LIMIT = SQUARE_N * SQUARE_N // 2  # 2 MiB, half a bool n × n array: outputs, row statistics, a few tiles fit


def check_no_square(call, what: str, convention: str) -> None:
    """call(), on inputs of SQUARE_N rows, must hold under SQUARE_LIMIT bytes beyond what was held
    before it (its inputs): any n × n array, float64 or bool, goes over."""
    __tracebackhide__ = True
    n = SQUARE_N
    peak = peak_bytes(call)
    assert peak < SQUARE_LIMIT, (
        f"{what}: {peak / 2**20:.1f} MiB allocated at the peak, expected under {SQUARE_LIMIT / 2**20:.0f} MiB "
        f"(one {n} × {n} float64 array is {n * n * 8 / 2**20:.0f} MiB, a bool one {n * n / 2**20:.0f} MiB)\n"
        f"  convention: {convention}")
