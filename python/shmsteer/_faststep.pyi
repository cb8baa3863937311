"""Type stub of the resolve extension (_faststep.c, built by ``go generate ./capi``)."""

CHANGED: int
SAME: int
INFO_BYTES: int

class Resolver:
    """A shmsteer_batch_t's resolve into the shmsteer_batch_info at ``info`` (addresses; the
    caller keeps both alive), compared with the last successful answer."""

    def __init__(self, batch: int, info: int) -> None: ...
    def resolve(self, version: int, spans: int, n: int, rows: int, flags: int) -> int:
        """A positive error code, or CHANGED or SAME against the last success."""
    def report(self, scores: int, n: int) -> tuple[int, int]:
        """shmsteer_batch_report of n float32 scores at ``scores`` (0: none): (error code, gate checksum)."""

def bind(batch_resolve: int, batch_report: int) -> None:
    """The loaded library's shmsteer_batch_resolve and shmsteer_batch_report addresses."""
