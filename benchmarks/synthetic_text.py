"""A synthetic English-like corpus for the loss check, with structure at three ranges: spelling
(a fixed lexicon of invented words), grammar (articles, subject-verb number agreement) and the
document (each uses a small topic vocabulary, and some sentences repeat an earlier sentence of
the same document, which only attention can predict). Deterministic for a seed; byte-level text.

python benchmarks/synthetic_text.py [--seed 0] [--bytes 2000]   # prints a sample
"""

import argparse
import random

CONSONANTS = "bcdfghjklmnprstvz"
VOWELS = "aeiou"


def invent_words(rng, count):
    words = set()
    while len(words) < count:
        words.add("".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(rng.randint(1, 3))))
    words = sorted(words)  # a set's order is not fixed across runs
    rng.shuffle(words)
    return words


class Grammar:
    def __init__(self, seed):
        self.rng = random.Random(seed)
        words = invent_words(self.rng, 560)
        self.nouns, self.verbs, self.adjectives = words[:240], words[240:400], words[400:520]
        self.names = [w.capitalize() for w in words[520:]]

    def noun_phrase(self, topic, plural):
        rng = self.rng
        article = "the" if plural or rng.random() < 0.5 else "a"
        adjectives = rng.sample(topic["adjectives"], rng.choice((0, 0, 1, 2)))
        noun = rng.choice(topic["nouns"]) + ("s" if plural else "")
        return " ".join([article, *adjectives, noun])

    def sentence(self, topic):
        rng = self.rng
        plural = rng.random() < 0.4
        subject = rng.choice(topic["names"]) if not plural and rng.random() < 0.3 else self.noun_phrase(topic, plural)
        words = [subject, rng.choice(topic["verbs"]) + ("" if plural else "s")]
        if rng.random() < 0.7:
            words.append(self.noun_phrase(topic, rng.random() < 0.4))
        text = " ".join(words)
        return text[0].upper() + text[1:] + "."

    def document(self):
        rng = self.rng
        topic = {"nouns": rng.sample(self.nouns, 12), "verbs": rng.sample(self.verbs, 8),
                 "adjectives": rng.sample(self.adjectives, 6), "names": rng.sample(self.names, 3)}
        sentences = []
        for _ in range(rng.randint(6, 16)):
            repeat = len(sentences) >= 2 and rng.random() < 0.3
            sentences.append(rng.choice(sentences) if repeat else self.sentence(topic))
        return " ".join(sentences) + "\n"


def corpus(seed, nbytes):
    """Exactly nbytes of documents (ASCII) from the grammar of this seed."""
    grammar, parts, size = Grammar(seed), [], 0
    while size < nbytes:
        parts.append(grammar.document())
        size += len(parts[-1])
    return "".join(parts)[:nbytes].encode("ascii")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bytes", type=int, default=2000)
    args = parser.parse_args()
    print(corpus(args.seed, args.bytes).decode())
