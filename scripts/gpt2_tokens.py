#!/usr/bin/env python3
"""GPT-2's token ids of a UTF-8 text file by the reference implementation, OpenAI's `tiktoken`
(`r50k_base`, encoded as ordinary text), written as decimal ids separated by spaces.
tests/gpt2_tokenizer.rs compares tandem's ids with these.

    python3 scripts/gpt2_tokens.py TEXT OUT [--asset r50k_base.tiktoken]

`tiktoken` downloads the table at first use; with --asset (the tiktoken-rs crate embeds it) it
reads that file instead, after checking it against the SHA-256 tiktoken itself expects.
Needs `pip install tiktoken`.
"""
import argparse
import hashlib
import os
import shutil
import sys
import tempfile

R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("text")
    ap.add_argument("out")
    ap.add_argument("--asset", help="a local copy of r50k_base.tiktoken")
    args = ap.parse_args()
    cache = None
    if args.asset:
        # tiktoken's cache names a blob by the SHA-1 of its URL, and checks the file's SHA-256.
        cache = tempfile.mkdtemp(prefix="tandem-tiktoken-")
        shutil.copyfile(args.asset, os.path.join(cache, hashlib.sha1(R50K_URL.encode()).hexdigest()))
        os.environ["TIKTOKEN_CACHE_DIR"] = cache
    try:
        import tiktoken

        enc = tiktoken.get_encoding("r50k_base")
        with open(args.text, encoding="utf-8", newline="") as f:
            text = f.read()
        ids = enc.encode_ordinary(text)
        with open(args.out, "w") as f:
            f.write(" ".join(map(str, ids)))
    finally:
        if cache:
            shutil.rmtree(cache, ignore_errors=True)
    print(f"{len(text)} characters, {len(ids)} tokens", file=sys.stderr)


if __name__ == "__main__":
    main()
