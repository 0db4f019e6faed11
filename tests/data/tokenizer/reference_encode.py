#!/usr/bin/env python3
"""The reference of the tokenizer tests (TokenizerReference.*): encodes each
line of a file with tiktoken's GPT-2 encoding and prints one JSON array of ids
per line.

    $GRADACCUM_VENV/bin/python reference_encode.py GPT2 FILE

GPT2 is a gpt2.tiktoken file or a directory holding one (or encoder.json and
vocab.bpe); see gpt2_reference.py. Nothing is downloaded. A line is the bytes
between b"\\n" (a final b"\\n" ends the last line), decoded with
bytes.decode("utf-8", errors="replace"), i.e. one U+FFFD for each maximal
ill-formed subsequence, as gradaccum decodes text, and encoded with
encode_ordinary: "<|endoftext|>" in the text is plain text.
"""
import json
import sys

from gpt2_reference import gpt2_encoding


def main():
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} GPT2_TIKTOKEN_OR_DIR FILE")
    encoding = gpt2_encoding(sys.argv[1])
    with open(sys.argv[2], "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    if data.endswith(b"\n") or not data:
        lines.pop()
    out = sys.stdout
    for line in lines:
        ids = encoding.encode_ordinary(line.decode("utf-8", errors="replace"))
        out.write(json.dumps(ids, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
