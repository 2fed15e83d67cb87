# Typing stub of the Rust extension `dsc._dsc`; the public API is in dsc/__init__.py.
from typing import List, Optional, Tuple

__version__: str

class Buffer:
    """One tensor's bytes, exported through the buffer protocol (flat, unsigned bytes)."""

    @property
    def zero_copy(self) -> bool: ...
    def __len__(self) -> int: ...

class CacheHandle:
    def __init__(self, path: str) -> None: ...
    def manifest_json(self) -> str: ...
    def stats_json(self) -> str: ...
    def steps(self, split: str, batch_size: int, world_size: int, drop_last: bool) -> int: ...
    def loader(
        self,
        split: str,
        batch_size: int,
        shuffle: bool,
        seed: int,
        epoch: int,
        samples: int,
        rank: int,
        world_size: int,
        drop_last: bool,
        prefetch: int,
        threads: int,
        trim: bool,
        window: int,
        interleave: int,
        bucket: bool,
        columns: List[str],
        writable: bool,
    ) -> LoaderHandle: ...

class LoaderHandle:
    def steps(self) -> int: ...
    def position(self) -> int: ...
    def tensors(self) -> List[Tuple[str, str, List[int], bool]]: ...
    def batch_bytes(self) -> List[int]: ...
    def next(self) -> Optional[Tuple[int, int, List[Tuple[str, str, List[int], Buffer]]]]: ...
    def fill(self, step: int, buffers: List[Tuple[int, int]]) -> int: ...
    def advance(self, n: int) -> None: ...
    def close(self) -> None: ...

def compile(
    spec_json: str,
    spec_file: Optional[str],
    out: str,
    force: bool,
    progress: bool,
    max_memory: Optional[int] = None,
    compress: Optional[str] = None,
    compress_level: Optional[int] = None,
) -> str: ...
def compile_stage(
    spec_json: str,
    spec_file: Optional[str],
    out: str,
    stage: str,
    index: int,
    count: int,
    max_memory: Optional[int],
    progress: bool,
) -> str: ...
def merge(
    out: str,
    force: bool,
    progress: bool,
    compress: Optional[str] = None,
    compress_level: Optional[int] = None,
) -> str: ...
def parse_size(text: str) -> int: ...
