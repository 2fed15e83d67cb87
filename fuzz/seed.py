"""Seeds the fuzz corpora from a real cache: its manifest, and each shard's header as the
shard_header target reads it (the file's length as 8 little-endian bytes, then the header JSON).

    python3 fuzz/seed.py demo/cache
"""

import pathlib
import struct
import sys

cache = pathlib.Path(sys.argv[1])
root = pathlib.Path(__file__).parent / "corpus"
(root / "manifest").mkdir(parents=True, exist_ok=True)
(root / "shard_header").mkdir(parents=True, exist_ok=True)
(root / "manifest" / "seed.json").write_bytes((cache / "manifest.json").read_bytes())
for shard in sorted((cache / "shards").glob("*.safetensors")):
    data = shard.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    seed = struct.pack("<Q", len(data)) + data[8 : 8 + n]
    (root / "shard_header" / shard.stem).write_bytes(seed)
print(f"seeded {root} from {cache}")
