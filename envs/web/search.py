"""Relevance-ranked product search (Okapi BM25 over an inverted index) with pagination."""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import lru_cache

from envhub.envs.web.catalog import Catalog, Product

PAGE_SIZE = 10
MAX_RESULTS = 50
_STOPWORDS = frozenset(
    "a an and are as at be by for from i i'm im in is it me my need of on or please the to under want with "
    "looking find get buy than less lower price dollars".split()
)


def tokenize(text: str) -> list[str]:
    """Lowercase word tokens with stopwords dropped and a plural 's' stripped."""
    tokens = []
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        if word in _STOPWORDS:
            continue
        if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        tokens.append(word)
    return tokens


def _document(product: Product) -> list[str]:
    # The title counts twice: it is what a shopper's words most often match.
    options = " ".join(v for values in product.options.values() for v in values)
    text = " ".join(
        [
            product.title,
            product.title,
            product.category,
            " ".join(product.attributes),
            options,
            product.description,
            product.asin,
        ]
    )
    return tokenize(text)


@dataclass(frozen=True)
class Page:
    """One page of search results."""

    query: str
    page: int
    pages: int
    total: int
    products: tuple[Product, ...]


class SearchIndex:
    """BM25 ranking of a catalogue's products for free-text queries."""

    def __init__(self, catalog: Catalog, *, k1: float = 1.5, b: float = 0.75) -> None:
        self.catalog = catalog
        self.k1, self.b = k1, b
        self._postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
        self._lengths: list[int] = []
        for doc_id, product in enumerate(catalog.products):
            tokens = _document(product)
            self._lengths.append(len(tokens))
            for term, count in Counter(tokens).items():
                self._postings[term].append((doc_id, count))
        self._average_length = sum(self._lengths) / max(1, len(self._lengths))
        n = len(self._lengths)
        self._idf = {t: math.log(1 + (n - len(p) + 0.5) / (len(p) + 0.5)) for t, p in self._postings.items()}
        self.rank = lru_cache(maxsize=2048)(self._rank)

    def _rank(self, query: str) -> tuple[Product, ...]:
        scores: dict[int, float] = defaultdict(float)
        for term in set(tokenize(query)):
            idf = self._idf.get(term)
            if idf is None:
                continue
            for doc_id, count in self._postings[term]:
                norm = self.k1 * (1 - self.b + self.b * self._lengths[doc_id] / self._average_length)
                scores[doc_id] += idf * count * (self.k1 + 1) / (count + norm)
        best = sorted(scores, key=lambda d: (-scores[d], d))[:MAX_RESULTS]
        return tuple(self.catalog.products[d] for d in best)

    def search(self, query: str, page: int = 1) -> Page:
        """The `page`-th page (1-based, clamped) of the best results for `query`."""
        ranked = self.rank(query.strip().lower())
        pages = max(1, math.ceil(len(ranked) / PAGE_SIZE))
        page = min(max(1, page), pages)
        start = (page - 1) * PAGE_SIZE
        return Page(query, page, pages, len(ranked), ranked[start : start + PAGE_SIZE])


@lru_cache(maxsize=4)
def search_index(catalog: Catalog) -> SearchIndex:
    """The (cached) search index of `catalog`."""
    return SearchIndex(catalog)
