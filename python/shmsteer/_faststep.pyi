"""Type stub of the resolve extension (_faststep.c, built by ``go generate ./capi``)."""

CHANGED: int
SAME: int
INFO_BYTES: int
SPAN_BYTES: int
PACK_FALLBACK: int
PACK_SAME: int
PACK_ADVANCED: int

class Resolver:
    """A shmsteer_batch_t's resolve into the shmsteer_batch_info at ``info`` (addresses; the
    caller keeps both alive), compared with the last successful answer."""

    def __init__(self, batch: int, info: int) -> None: ...
    def resolve(self, version: int, spans: int, n: int, rows: int, flags: int) -> int:
        """A positive error code, or CHANGED or SAME against the last success."""
    def begin(self, version: int, spans: int, n: int, rows: int) -> int:
        """The native resolve (SHMSTEER_BATCH_NATIVE) into the info structure: the error code."""
    def report(self, scores: int, n: int) -> tuple[int, int]:
        """shmsteer_batch_report of n float32 scores at ``scores`` (0: none): (error code, gate checksum)."""

def bind(batch_resolve: int, batch_report: int, stepper_apply: int, stepper_apply_bf16: int,
         stepper_end: int) -> None:
    """The loaded library's functions' addresses."""

def apply(stepper: int, hook: int, layer: int, rows: int, n: int, spans: int, n_spans: int, bf16: bool) -> int:
    """shmsteer_stepper_apply (or _bf16) on n elements at the address rows: the error code."""

def end(stepper: int) -> tuple[int, int]:
    """shmsteer_stepper_end of a native step: (error code, checksum)."""

def pack(spans: object, ids: dict[object, tuple[bytes, int]], scratch: int, cap: int, last: int,
         last_n: int) -> int | tuple[bytearray, int, int]:
    """A step's 5-tuple spans as shmsteer_span records at ``scratch`` (``cap`` of them),
    compared with the ``last_n`` records at ``last`` (-1: none): PACK_SAME, PACK_ADVANCED (the
    positions written into last), PACK_FALLBACK (spans it does not take), or new records
    (a bytearray of them, its address, the highest end)."""

def index_rows(index: int, n: int, out: int, cap: int) -> int:
    """The steered rows of n int32 slots at ``index``, as int64 rows at out[:k] and their slots
    at out[k:2k] (``out``: room for 2 * cap int64, n <= cap): k."""
