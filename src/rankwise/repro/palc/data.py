"""The preference set of the PALC reproduction, built from the wiki corpus so that no rule on the response alone
can satisfy it.

Prompt: "Human: Tell me about {title}.\n\nAssistant:" for an article. Responses: the opening words of *other*
articles' summaries. Chosen: one from an article of the prompt's topic; rejected: one from another topic. Pairs come
in twins, (p_A: r_A > r_B) and (p_B: r_B > r_A), with topic(p_A) = topic(r_A) != topic(p_B) = topic(r_B): every
response is chosen once and rejected once, so any score of the response alone gets exactly half the pairs right
(it prefers r_A in both twins or r_B in both). What is preferred is relevance to the prompt, which the frozen model
can read from its context and a static (position-independent) logit offset cannot.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass

from rankwise.data.wiki import Article, articles
from rankwise.recipes.palc import PreferencePair

PROMPT = "Human: Tell me about {title}.\n\nAssistant:"


@dataclass(frozen=True)
class TopicPair:
    pair: PreferencePair
    prompt_topic: str


def opening(text: str, words: int) -> str:
    return " " + " ".join(text.split()[:words])


def twin_pairs(pool: list[Article], n_twins: int, words: int, seed: int) -> list[TopicPair]:
    """2 * n_twins pairs from `pool`: every prompt's article is used once; responses are drawn from the other
    articles of the pool (one article may answer several twins: the balance holds within each twin)."""
    rng = random.Random(seed)
    by_topic: dict[str, list[Article]] = defaultdict(list)
    for a in pool:
        by_topic[a.topic].append(a)
    prompts = {t: rng.sample(items, len(items)) for t, items in sorted(by_topic.items())}
    out: list[TopicPair] = []
    while len(out) < 2 * n_twins:
        open_topics = [t for t in sorted(prompts) if prompts[t] and len(by_topic[t]) >= 2]
        if len(open_topics) < 2:
            raise ValueError(f"the pool of {len(pool)} articles cannot give {n_twins} twins")
        ta, tb = rng.sample(open_topics, 2)
        pa, pb = prompts[ta].pop(), prompts[tb].pop()
        ra = rng.choice([a for a in by_topic[ta] if a is not pa])
        rb = rng.choice([a for a in by_topic[tb] if a is not pb])
        resp_a, resp_b = opening(ra.text, words), opening(rb.text, words)
        out.append(TopicPair(PreferencePair(PROMPT.format(title=pa.title), resp_a, resp_b), ta))
        out.append(TopicPair(PreferencePair(PROMPT.format(title=pb.title), resp_b, resp_a), tb))
    return out


@dataclass(frozen=True)
class PreferenceData:
    train: list[TopicPair]
    val: list[TopicPair]
    test: list[TopicPair]
    neutral: list[tuple[str, str]]  # (first words, the rest): text for the drift measures
    neutral_topics: list[str]  # the topic of each neutral text's article (the judge's sanity check)
    generation: list[tuple[str, str]]  # (prompt, the prompt article's topic) for generation
    judge_texts: list[str]  # train-split summaries and their topics: the topic judge's training data
    judge_topics: list[str]


def build(n_train: int, n_val: int, n_test: int, words: int, n_neutral: int, n_generation: int,
          seed: int = 0) -> PreferenceData:
    """Train pairs from the corpus's train split; validation, test, neutral text and generation prompts from its
    eval split, disjoint by article."""
    train_pool, eval_pool = articles("train"), articles("eval")
    rng = random.Random(seed + 1)
    eval_pool = list(eval_pool)
    rng.shuffle(eval_pool)
    reserved, vt_pool = eval_pool[:n_neutral + n_generation], eval_pool[n_neutral + n_generation:]
    vt = twin_pairs(vt_pool, (n_val + n_test) // 2, words, seed + 2)
    neutral = [(" ".join(a.text.split()[:3]), " " + " ".join(a.text.split()[3:40])) for a in reserved[:n_neutral]]
    gen = [(PROMPT.format(title=a.title), a.topic) for a in reserved[n_neutral:]]
    judge = train_pool[::2]
    return PreferenceData(
        train=twin_pairs(train_pool, n_train // 2, words, seed + 3),
        val=vt[:n_val], test=vt[n_val:n_val + n_test], neutral=neutral,
        neutral_topics=[a.topic for a in reserved[:n_neutral]], generation=gen,
        judge_texts=[a.text for a in judge], judge_topics=[a.topic for a in judge])
