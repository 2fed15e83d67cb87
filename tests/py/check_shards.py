"""Opens every shard of a dsc cache with the Python `safetensors` package (an implementation
independent of dsc) and prints, per shard and tensor, its dtype, shape and an exact checksum:
the sum of the tensor's bytes read as little-endian uint32 words."""
import json
import sys

import numpy as np
from safetensors.numpy import load_file


def main(cache):
    with open(f"{cache}/manifest.json") as f:
        manifest = json.load(f)
    out = {}
    for shard in manifest["shards"]:
        tensors = load_file(f"{cache}/{shard['file']}")
        out[shard["file"]] = {
            name: {
                "dtype": str(t.dtype),
                "shape": list(t.shape),
                "u32sum": int(np.ascontiguousarray(t).view("<u4").astype(np.uint64).sum()),
            }
            for name, t in tensors.items()
        }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
