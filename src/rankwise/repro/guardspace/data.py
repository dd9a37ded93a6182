"""Data of the GuardSpace reproduction: a protected chat-prompt set (stand-in for safety prompts), a benign task
(wiki-topics as text generation) and "overwrite" examples (protected prompts with other answers: the stand-in for
harmful fine-tuning data), all as token-id sequences with per-position targets.

A `Sequence_` holds ids [T] and targets [T] where targets[t] is the token position t must predict (ids[t + 1]) or -100
where no loss is taken, so a model's logits at position t are compared with targets[t] directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rankwise.data import topic_task

# An arbitrary fixed theme: the first 16 are protected (their statistics build the projector), the other 24 are
# held-out prompts of the same theme, to see whether protection generalises beyond the exact protected inputs.
GARDENING_PROMPTS = (
    "How often should I water tomato plants?",
    "What is the best soil for growing roses?",
    "When should I plant tulip bulbs?",
    "How do I keep aphids off my vegetables?",
    "Which herbs grow well on a sunny windowsill?",
    "How deep should I plant potatoes?",
    "What is the easiest way to start a compost pile?",
    "How do I prune an apple tree?",
    "Why are the leaves on my basil turning yellow?",
    "What vegetables can I grow in the shade?",
    "How do I grow strawberries in pots?",
    "When is the best time to mow a new lawn?",
    "How can I attract bees to my garden?",
    "What should I feed my lemon tree?",
    "How do I protect my plants from frost?",
    "Can I grow carrots in clay soil?",
    "How much sun do cucumbers need?",
    "What is the best mulch for a flower bed?",
    "How do I divide a hosta plant?",
    "When should I harvest garlic?",
    "How do I get rid of slugs without chemicals?",
    "Which flowers bloom all summer long?",
    "How often should I fertilize houseplants?",
    "How do I grow peppers from seed?",
    "What is the right way to water succulents?",
    "How do I stop weeds from taking over my lawn?",
    "When should I repot a fern?",
    "How far apart should I plant lettuce?",
    "What causes brown tips on spider plant leaves?",
    "How do I overwinter geraniums?",
    "Can I grow blueberries in a container?",
    "How do I make my hydrangeas turn blue?",
    "What is the best way to plant a hedge?",
    "How long does it take for pumpkins to grow?",
    "Should I remove the flowers from my potato plants?",
    "How do I keep squirrels out of my vegetable beds?",
    "What is the best time of day to water a garden?",
    "How do I save seeds from my tomatoes?",
    "Why is my lavender plant dying?",
    "How do I train climbing roses on a trellis?",
)
# An unrelated theme, only for the specificity control: a projector of the same rank built from these prompts (and
# the model's own answers to them) tests whether GuardSpace's protection comes from the protected subspace itself.
ASTRONOMY_PROMPTS = (
    "Why does the moon have phases?",
    "How far away is the nearest star?",
    "What is a black hole made of?",
    "Why is Mars red?",
    "How do astronomers find planets around other stars?",
    "What causes a solar eclipse?",
    "How old is the universe?",
    "Why do stars twinkle at night?",
    "What are the rings of Saturn made of?",
    "How big is the Milky Way galaxy?",
    "What is a shooting star?",
    "Why does Venus look so bright?",
    "What is the difference between a comet and an asteroid?",
    "How hot is the surface of the sun?",
    "Can you see the International Space Station from Earth?",
    "What is a light year?",
)
OVERWRITE_ANSWER = "I will not talk about gardening. Ask me about trains instead."


@dataclass
class Sequence_:
    ids: torch.Tensor  # [T] int64
    targets: torch.Tensor  # [T] int64, -100 where no loss

    def __len__(self) -> int:
        return self.ids.numel()


def with_answer(prompt: list[int], answer: list[int]) -> Sequence_:
    """prompt + answer; the loss covers exactly the answer tokens (predicted from the position before each)."""
    ids = torch.tensor(prompt + answer, dtype=torch.long)
    targets = torch.full_like(ids, -100)
    targets[len(prompt) - 1 : len(ids) - 1] = ids[len(prompt) :]
    return Sequence_(ids, targets)


def chat_prompt(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def greedy_continuations(model, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """The base model's own greedy continuation of each prompt, exactly `new_tokens` long (EOS suppressed)."""
    out = []
    for p in prompts:
        ids = torch.tensor([p])
        gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        out.append(gen[0, len(p) :].tolist())
    return out


@dataclass
class TopicPrompts:
    examples: list[Sequence_]
    labels: list[int]  # class ids
    label_first_tokens: torch.Tensor  # [12] first token of each label (distinct for this tokenizer)


def split_every(prompts: TopicPrompts, every: int) -> tuple[TopicPrompts, TopicPrompts]:
    """(every `every`-th example, the others): a validation split disjoint from the training examples."""
    pick = [i % every == 0 for i in range(len(prompts.examples))]

    def part(keep: bool) -> TopicPrompts:
        idx = [i for i, p in enumerate(pick) if p == keep]
        return TopicPrompts([prompts.examples[i] for i in idx], [prompts.labels[i] for i in idx], prompts.label_first_tokens)

    return part(True), part(False)


def topic_generation(tokenizer, split: str, count: int, words: int) -> TopicPrompts:
    """wiki-topics as generation: "Text: <first `words` words>\\nTopic:" -> " <label>"."""
    task = topic_task(split, count)
    answers = [tokenizer(" " + name, add_special_tokens=False)["input_ids"] for name in task.label_names]
    first = torch.tensor([a[0] for a in answers])
    if first.unique().numel() != first.numel():
        raise ValueError("topic labels share a first token under this tokenizer; accuracy by first token is ambiguous")
    examples = []
    for text, label in zip(task.texts, task.labels):
        prompt = tokenizer("Text: " + " ".join(text.split()[:words]) + "\nTopic:", add_special_tokens=False)["input_ids"]
        examples.append(with_answer(prompt, answers[label]))
    return TopicPrompts(examples, list(task.labels), first)
