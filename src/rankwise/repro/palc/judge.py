"""A topic judge for generations: tf-idf + logistic regression (scikit-learn) trained on train-split summaries of
the wiki corpus, predicting one of its 12 topics. It stands in for the paper's LLM judge on one criterion
(relevance: is the continuation about the prompt's topic?), and its own held-out accuracy is reported."""

from __future__ import annotations

from collections.abc import Sequence

from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline


def fit_judge(texts: Sequence[str], topics: Sequence[str], seed: int = 0) -> Pipeline:
    judge = Pipeline([("tfidf", TfidfVectorizer(sublinear_tf=True, min_df=2, ngram_range=(1, 2))),
                      ("lr", LogisticRegression(max_iter=2000, C=10.0, random_state=seed))])
    return judge.fit(list(texts), list(topics))


def topic_match_rate(judge: Pipeline, texts: Sequence[str], topics: Sequence[str]) -> float:
    if not texts:
        return float("nan")
    predicted = judge.predict(list(texts))
    return float(sum(p == t for p, t in zip(predicted, topics)) / len(texts))
