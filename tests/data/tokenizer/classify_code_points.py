#!/usr/bin/env python3
"""Prints, for every code point 0..0x10FFFF, the class GPT-2's pre-tokenizer
regex gives it under the Python `regex` module's Unicode tables: 's' (\\s),
'L' (\\p{L}), 'N' (\\p{N}) or '.' (other). Surrogates (not characters) print
'.'. Used by TokenizerReference.UnicodeClassesMatchPythonRegexUpToNewerAssignments:

    $GRADACCUM_VENV/bin/python classify_code_points.py > classes.bin

tiktoken's regex engine (Rust's fancy-regex over the regex crate) cannot be
asked for a class from Python; the `regex` module (a tiktoken dependency, and
what OpenAI's original GPT-2 encoder.py used) defines the classes the same way:
\\s is Unicode's White_Space property (U+0085 included, U+FEFF and
U+001C..U+001F not), \\p{L} and \\p{N} the general categories L* and N*. Its
Unicode version may be newer than tiktoken's and gradaccum's.
"""
import sys

import regex

SURROGATES = range(0xD800, 0xE000)


def main():
    classes = bytearray(b"." * 0x110000)
    text = "".join("\uFFFF" if cp in SURROGATES else chr(cp) for cp in range(0x110000))
    for pattern, mark in ((r"\s", b"s"), (r"\p{L}", b"L"), (r"\p{N}", b"N")):
        for m in regex.finditer(pattern, text):
            classes[m.start()] = mark[0]
    for cp in SURROGATES:
        classes[cp] = ord(".")
    sys.stdout.buffer.write(bytes(classes))


if __name__ == "__main__":
    main()
