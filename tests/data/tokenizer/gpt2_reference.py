"""The tokenizer tests' reference: tiktoken's GPT-2 encoding, built offline.

tiktoken.get_encoding("gpt2") would download GPT-2's files; this module builds
the same encoding from a local copy instead (scripts/setup.sh installs
/var/lib/gradaccum/gpt2/gpt2.tiktoken) and never touches the network. Used by
reference_encode.py, gen_golden.py and gen_hf_golden.py, run with the venv's
Python ($GRADACCUM_VENV/bin/python, tiktoken installed by scripts/setup.sh).
"""
import os

# tiktoken caches files it reads in a temporary directory unless this is "".
os.environ["TIKTOKEN_CACHE_DIR"] = ""

import tiktoken  # noqa: E402
from tiktoken.load import data_gym_to_mergeable_bpe_ranks, load_tiktoken_bpe  # noqa: E402

# GPT-2's pre-tokenizer regex as tiktoken writes it (tiktoken_ext.openai_public,
# r50k_pat_str; the "gpt2" encoding uses it). Same pieces as GPT-2's original
# 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
ENDOFTEXT = "<|endoftext|>"
ENDOFTEXT_ID = 50256


def gpt2_ranks(path):
    """GPT-2's mergeable ranks from a gpt2.tiktoken file, or from a directory
    holding gpt2.tiktoken or else encoder.json and vocab.bpe (the order in
    which gradaccum's Tokenizer::load looks; a tokenizer.json is not read)."""
    if "://" in path:
        raise ValueError(f"{path}: only local files (the reference must not download anything)")
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, "gpt2.tiktoken")):
            path = os.path.join(path, "gpt2.tiktoken")
        else:
            return data_gym_to_mergeable_bpe_ranks(
                vocab_bpe_file=os.path.join(path, "vocab.bpe"),
                encoder_json_file=os.path.join(path, "encoder.json"))
    return load_tiktoken_bpe(path)


def gpt2_encoding(path):
    """tiktoken's GPT-2 encoding with the ranks at path (see gpt2_ranks)."""
    return tiktoken.Encoding(name="gpt2_local", pat_str=GPT2_PATTERN,
                             mergeable_ranks=gpt2_ranks(path),
                             special_tokens={ENDOFTEXT: ENDOFTEXT_ID})


def byte_characters(token):
    """GPT-2's spelling of bytes as text (encoder.json's keys, vocab.bpe's
    merges): printable Latin-1 bytes as themselves, the other 68 bytes as
    U+0100 onwards in byte order."""
    table, extra = {}, 0
    for b in range(256):
        if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + extra)
            extra += 1
    return "".join(table[b] for b in token)


def gpt2_vocab_and_merges(ranks):
    """encoder.json's vocabulary ({byte characters: id}, <|endoftext|> included)
    and vocab.bpe's merges ([(left, right)] in byte characters, in rank order)
    implied by tiktoken ranks: in rank order, a token's merge is the two parts
    that BPE with the merges found so far leaves of its bytes (as gradaccum's
    tiktoken_merges does)."""
    merged_of = {}
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            best = None
            for k in range(len(parts) - 1):
                r = merged_of.get((parts[k], parts[k + 1]))
                if r is not None and (best is None or r < best[0]):
                    best = (r, k)
            if best is None:
                break
            k = best[1]
            parts[k:k + 2] = [parts[k] + parts[k + 1]]
        if len(parts) != 2:
            raise ValueError(f"token of rank {rank} is not two lower-ranked tokens merged")
        merged_of[(parts[0], parts[1])] = rank
        merges.append((byte_characters(parts[0]), byte_characters(parts[1])))
    vocab = {byte_characters(token): rank for token, rank in ranks.items()}
    vocab[ENDOFTEXT] = ENDOFTEXT_ID
    return vocab, merges
