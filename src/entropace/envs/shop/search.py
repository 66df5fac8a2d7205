"""BM25 search over the catalogue (WebShop's search engine is Pyserini BM25 over the same
fields: title, category, attributes)."""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Sequence

from entropace.envs.shop.catalogue import Product

_TOKEN = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    """Lower-case alphanumeric tokens; a trailing plural ``s`` is dropped from longer words."""
    out = []
    for tok in _TOKEN.findall(text.lower()):
        if len(tok) > 3 and tok.endswith("s") and not tok.endswith("ss"):
            tok = tok[:-1]
        out.append(tok)
    return out


def product_document(product: Product) -> str:
    """The text a product is indexed by."""
    return " ".join([product.title, product.category, product.department, *product.attributes])


class SearchIndex:
    """Okapi BM25 (k1 = 1.2, b = 0.75) over :func:`product_document`.

    ``search(query, k)`` returns product indices, best first; ties are broken by catalogue
    order so results are deterministic.
    """

    def __init__(self, products: Sequence[Product], *, k1: float = 1.2, b: float = 0.75) -> None:
        self.products = products
        self.k1, self.b = k1, b
        self.postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
        self.doc_len: list[int] = []
        for i, product in enumerate(products):
            tokens = tokenize(product_document(product))
            self.doc_len.append(len(tokens))
            for tok, tf in Counter(tokens).items():
                self.postings[tok].append((i, tf))
        n = len(products)
        self.avg_len = sum(self.doc_len) / max(1, n)
        self.idf = {
            tok: math.log(1.0 + (n - len(p) + 0.5) / (len(p) + 0.5))
            for tok, p in self.postings.items()
        }

    def search(self, query: str, k: int = 50) -> list[int]:
        scores: dict[int, float] = defaultdict(float)
        for tok in set(tokenize(query)):
            idf = self.idf.get(tok)
            if idf is None:
                continue
            for doc, tf in self.postings[tok]:
                norm = tf + self.k1 * (1 - self.b + self.b * self.doc_len[doc] / self.avg_len)
                scores[doc] += idf * tf * (self.k1 + 1) / norm
        ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
        return [doc for doc, _ in ranked[:k]]
