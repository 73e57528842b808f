"""The most frequent English words, as text for the Qwen draft's head-token list
(`train/qwen_head_tokens.sh`): each word with a leading space, lower case and capitalized, as it
appears inside a sentence and at its start.

Usage: python3 train/english_words.py WORDFREQ_WHEEL N OUT.txt
WORDFREQ_WHEEL is wordfreq 3.1.1's wheel (`pip download wordfreq==3.1.1 --no-deps`); its
large English list (word frequencies from many sources, in centibel buckets) is read with msgpack.
"""
import gzip
import sys
import zipfile

import msgpack


def main():
    wheel, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with zipfile.ZipFile(wheel) as z:
        packed = gzip.decompress(z.read("wordfreq/data/large_en.msgpack.gz"))
    buckets = msgpack.unpackb(packed, raw=False)[1:]
    words = [w for bucket in buckets for w in bucket][:n]
    with open(out, "w") as f:
        for w in words:
            f.write(f" {w} {w[:1].upper()}{w[1:]}\n")
    print(f"{out}: {len(words)} words, the last one '{words[-1]}'")


if __name__ == "__main__":
    main()
