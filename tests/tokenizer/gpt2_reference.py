"""GPT-2's encoder as the reference of gpt2_regex_reference_test.cpp.

Usage: gpt2_reference.py VOCAB_JSON MERGES_TXT TEXTS_HEX OUT

TEXTS_HEX holds one text per line, hex-encoded bytes. For each text OUT gets two lines: "P" and the
pre-tokens (hex), then "I" and the ids. The split is GPT-2's own: the `regex` module (Debian's
python3-regex, the module openai/gpt-2 imports) with GPT-2's pattern. Bytes that are not UTF-8 are read
with Python's surrogateescape (each such byte becomes one lone surrogate, category Cs, neither letter,
number nor space) and written back the same way: the rule ampscope documents for them. The merges follow
GPT-2's bpe(): take the lowest-ranked adjacent pair, merge every occurrence left to right, repeat. The files
are read as GPT-2's get_encoder() reads them (json.load; merges.txt split on newlines, the first line and
the last, empty, one dropped).

Exit status 3 when the regex module is missing.
"""
import json
import sys

try:
    import regex
except ImportError:
    sys.exit(3)

PATTERN = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def byte_symbols():
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


def merge_rounds(word, ranks):
    word = list(word)
    while len(word) > 1:
        pairs = set(zip(word, word[1:]))
        best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if best not in ranks:
            break
        left, right = best
        merged, i = [], 0
        while i < len(word):
            if i + 1 < len(word) and word[i] == left and word[i + 1] == right:
                merged.append(left + right)
                i += 2
            else:
                merged.append(word[i])
                i += 1
        word = merged
    return word


def main():
    vocab_path, merges_path, texts_path, out_path = sys.argv[1:5]
    with open(vocab_path, encoding="utf-8") as f:
        vocab = json.load(f)
    with open(merges_path, encoding="utf-8") as f:
        lines = f.read().split("\n")[1:-1]
    ranks = {tuple(line.split()): k for k, line in enumerate(lines)}
    table = byte_symbols()
    with open(texts_path) as f, open(out_path, "w") as out:
        for line in f:
            data = bytes.fromhex(line.strip())
            text = data.decode("utf-8", errors="surrogateescape")
            pieces = [p.encode("utf-8", errors="surrogateescape") for p in PATTERN.findall(text)]
            ids = []
            for piece in pieces:
                ids.extend(vocab[s] for s in merge_rounds("".join(table[b] for b in piece), ranks))
            out.write("P " + " ".join(p.hex() for p in pieces) + "\n")
            out.write("I " + " ".join(str(i) for i in ids) + "\n")


if __name__ == "__main__":
    main()
