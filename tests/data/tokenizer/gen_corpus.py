#!/opt/gradaccum/venv/bin/python
"""Writes corpus.txt, the varied text TokenizerReference compares against tiktoken.

    /opt/gradaccum/venv/bin/python tests/data/tokenizer/gen_corpus.py   (needs `bible`: Debian's bible-kjv)

Lines: KJV verses (Genesis 1-3, Psalm 23, John 1), hand-written lines in many
scripts, then seeded random mixtures of letters, digits, punctuation, emoji,
Unicode spaces, contraction fragments and invalid UTF-8 bytes. The random code
points are drawn from blocks assigned by Unicode 14, so the comparison does
not depend on which newer Unicode version the reference's regex engine has.
(The line "<|endoftext|> is just text to gpt-3-encoder" predates tiktoken as
the reference; it is plain text to tiktoken's encode_ordinary too.)
"""
import os
import random
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))

HAND_WRITTEN = [
    "The quick brown fox jumps over the lazy dog.",
    "She said, \"It's 5 o'clock somewhere\" -- and we'd all laughed.",
    "Prices: $1,299.99 (was $1,499.00); save 13% today!",
    "E = mc^2, a^2 + b^2 = c^2, and 1/3 ~ 0.333...",
    "    indented code()  {  return  a[i]  +  b[j];  }",
    "\ttab\tseparated\tvalues\t",
    "Ünïcödé ñoños façade Æsir Øresund ß straße",
    "Ελληνικά: Η γρήγορη καφέ αλεπού πηδάει.",
    "Русский: Съешь же ещё этих мягких французских булок!",
    "中文：我能吞下玻璃而不伤身体。日本語：私はガラスを食べられます。",
    "한국어: 나는 유리를 먹을 수 있어요. 그래도 아프지 않아요.",
    "العربية: أنا قادر على أكل الزجاج و هذا لا يؤلمني.",
    "עברית: אני יכול לאכול זכוכית וזה לא מזיק לי.",
    "हिन्दी: मैं काँच खा सकता हूँ और मुझे उससे कोई चोट नहीं पहुंचती.",
    "ไทย: ฉันกินกระจกได้ แต่มันไม่ทำให้ฉันเจ็บ",
    "Emoji: 😀😃😄 👍🏿 🧑‍💻 ❤️ 🏳️‍🌈 🇯🇵🇫🇷",
    "Math: ∀x∈ℝ, x² ≥ 0; ∑ᵢ aᵢ = ∫ f(x) dx ≈ π",
    "Fractions ½ ⅓ ¼ and numerals Ⅰ Ⅱ Ⅲ Ⅳ and digits ٠١٢٣ ०१२३ ๐๑๒",
    "Wide：ＡＢＣ　ｄｅｆ　１２３",
    "Zero\u200bwidth\u200cjoiners\u200dand\u2060word joiner",
    "NBSP\u00a0here, thin\u2009space, ideographic\u3000space, en\u2002quad.",
    "Next line\u0085char and BOM\ufeffinside",
    "<|endoftext|> is just text to gpt-3-encoder",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE",
    "rock'n'roll y'all ma'am o'er 'tis '90s",
    "https://example.org/a/b?c=d&e=f#g user@example.com",
    "C:\\Users\\name\\file.txt /usr/local/bin",
    "SELECT * FROM t WHERE x >= 10 AND y <> 'z';",
    "{\"key\": [1, 2.5, -3e10, true, null]}",
    "     ",
    "",
    "a",
    " ",
    "!",
    "1",
]

POOLS = {
    "ascii_letters": [chr(c) for c in range(0x41, 0x5B)] + [chr(c) for c in range(0x61, 0x7B)],
    "digits": [chr(c) for c in range(0x30, 0x3A)] + list("²³¹¼½¾٠١٢३४५") + ["\u2160", "\u2781", "\U0001D7CE"],
    "punct": list("!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~") + list("¡¿«»—–…‘’“”•€£¥©®°±×÷"),
    "apostrophe": ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'", "'x", "'S"],
    "spaces": [" ", " ", " ", "  ", "\t", "\n", "\r", "\u00a0", "\u2003", "\u3000", "\u2009", "\ufeff", "\u0085", "\u200b"],
    "latin_ext": [chr(c) for c in range(0xC0, 0x250) if c not in (0xD7, 0xF7)],
    "greek_cyrillic": [chr(c) for c in range(0x391, 0x3AA)] + [chr(c) for c in range(0x410, 0x450)],
    "cjk": [chr(c) for c in range(0x4E00, 0x4E80)] + [chr(c) for c in range(0x3041, 0x3097)] + [chr(c) for c in range(0xAC00, 0xAC40)],
    "indic_arabic": [chr(c) for c in range(0x905, 0x93A)] + ["\u093e", "\u094d"] + [chr(c) for c in range(0x621, 0x64B)],
    "marks": ["\u0301", "\u0308", "\u0327", "\u20dd", "\ufe0f", "\u200d"],
    "emoji": [chr(c) for c in range(0x1F600, 0x1F640)] + ["\U0001F44D", "\U0001F3FD", "\U0001F1FA", "\U0001F1F8", "\u2764"],
    "astral_letters": [chr(c) for c in range(0x1D400, 0x1D420)] + [chr(c) for c in range(0x20000, 0x20010)],
}
INVALID = [b"\xff", b"\x80", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\xf0\x9f\x98"]


def random_line(rng):
    parts = []
    for _ in range(rng.randint(1, 40)):
        pool = rng.choice(list(POOLS))
        run = "".join(rng.choice(POOLS[pool]) for _ in range(rng.randint(1, 6)))
        parts.append(run.encode("utf-8").replace(b"\n", b" "))
        if rng.random() < 0.05:
            parts.append(rng.choice(INVALID))
    return b"".join(parts)


def main():
    lines = []
    for ref in ["Gen1:1-Gen3:24", "Ps23:1-Ps23:6", "John1:1-John1:51"]:
        out = subprocess.run(["bible", "-f", ref], check=True, capture_output=True).stdout
        lines += [line for line in out.split(b"\n") if line.strip()]
    lines += [s.encode("utf-8") for s in HAND_WRITTEN]
    rng = random.Random(20240517)
    lines += [random_line(rng) for _ in range(300)]
    with open(os.path.join(HERE, "corpus.txt"), "wb") as f:
        f.write(b"".join(line + b"\n" for line in lines))
    print(f"wrote corpus.txt: {len(lines)} lines")


if __name__ == "__main__":
    main()
