"""Write rbjax/data/redditbias_manifest.json: sha256 and size of every upstream RedditBias data file.

Run against a byte-identical copy of umanlp/RedditBias at the pinned commit (here ../shared/redditbias,
checked with git hash-object, see its SOURCE.md). The package downloads files from the upstream
repository at that commit and verifies them against this manifest.
"""
import hashlib
import json
import sys
from pathlib import Path

COMMIT = "61f9ae9458e26a64ae1113425192280503f8fb92"
src = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/redditbias")
files = {}
for p in sorted(src.rglob("*")):
    rel = p.relative_to(src).as_posix()
    if p.is_file() and rel.split("/")[0] in ("data", "text_files"):
        b = p.read_bytes()
        files[rel] = {"sha256": hashlib.sha256(b).hexdigest(), "bytes": len(b)}
out = Path(__file__).resolve().parents[1] / "rbjax" / "data" / "redditbias_manifest.json"
out.write_text(json.dumps({"repository": "umanlp/RedditBias", "commit": COMMIT,
                           "url": f"https://raw.githubusercontent.com/umanlp/RedditBias/{COMMIT}/",
                           "files": files}, indent=1) + "\n")
print(f"{len(files)} files -> {out}")
