"""Type stub of the key get extension (_fastkeys.c, built by ``go generate ./capi``)."""

from typing import Union

KEY_BUFFER_BYTES: int

class KeysBase:
    """C base of shmsteer.keys._FastKeys: ``keys[id]`` as a type slot."""

    def __getitem__(self, request_id: Union[str, bytes]) -> bytes: ...

def bind(reader_key_get: int, key_get: int) -> None:
    """The loaded library's shmsteer_reader_key_get and shmsteer_key_get addresses."""
