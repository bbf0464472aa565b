"""CG128: the generation config's end-of-sequence ids against the tokenizer and the chat template.

``generate`` stops at any id of generation_config.json's ``eos_token_id``.  NousResearch/Hermes-4-14B shipped the
pad token there instead of the chat template's end-of-turn token, and many quantizations copied it: generation ran
to the token limit.  Compared here, from the JSON files only (no tokenizer library): the ids against
tokenizer_config.json's ``eos_token`` and ``pad_token`` (resolved to ids by its ``added_tokens_decoder`` and
tokenizer.json's ``added_tokens``), against config.json's own ``eos_token_id``, and against the end-of-turn token
the chat template writes after each turn. Only a model saved with both a generation config and a tokenizer is
compared (a test's tiny model keeps its class's default ids, GPT-2's 50256, in a vocabulary of 100: nothing
generates from it).

- the generation config's ids include neither the tokenizer's ``eos_token`` nor config.json's: a warning;
- the ids are the pad token alone (where the pad token is not the tokenizer's ``eos_token``): a warning;
- a chat template is present and the ids lack its end-of-turn token, unless they hold the tokenizer's own
  ``eos_token`` (a base model, its ``<|endoftext|>``, with a template for its instruct sibling): a warning;
- an id outside the vocabulary (config.json's ``vocab_size``): an error, the model can never emit it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from guard.catalogue import make_finding
from guard.config import Policy
from guard.findings import Finding, Severity, shown
from guard.inventory import ModelInventory
from guard.inventory.model import CHAT_TEMPLATE, GENERATION_CONFIG, TOKENIZER, TOKENIZER_CONFIG

# the end-of-turn tokens chat templates write after each message, as the model families spell them
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|eot|>", "<|END_OF_TURN_TOKEN|>",
               "<|end_of_turn|>", "<|endofturn|>")


def applies(inventory: ModelInventory) -> bool:
    return bool(inventory.token_files)


def check_eos_tokens(inventory: ModelInventory, policy: Policy) -> list[Finding]:
    files = inventory.token_files
    config: dict[str, object] = inventory.config if isinstance(inventory.config, dict) else {}
    nested = config.get("text_config")  # a multimodal model's language side
    text_config: dict[str, object] = nested if isinstance(nested, dict) else {}
    generation = _json(files, GENERATION_CONFIG)
    tokenizer = _json(files, TOKENIZER_CONFIG)
    found = _ids(generation.get("eos_token_id")) if generation is not None else None
    if found is None or (tokenizer is None and TOKENIZER not in files):
        return []  # what generate stops at, against a tokenizer: a model saved without either is not compared
    source = files[GENERATION_CONFIG][0]
    ids = _vocabulary(files, tokenizer)
    by_token: dict[str, int] = {}
    for token_id, content in sorted(ids.items(), reverse=True):  # the lowest id of a repeated content wins
        by_token[content] = token_id
    vocab_size = config.get("vocab_size", text_config.get("vocab_size"))
    config_eos = _ids(config.get("eos_token_id", text_config.get("eos_token_id")))
    config_path = inventory.config_path or "config.json"
    findings: list[Finding] = []
    for path, checked in ((source, found), (config_path, config_eos)):
        bound = vocab_size if type(vocab_size) is int and vocab_size > 0 else None
        outside = [i for i in checked or () if i < 0 or (bound is not None and i >= bound)]
        if outside:
            findings.append(make_finding(
                "CG128", path, f"eos_token_id {_list(outside)} is outside the vocabulary (config.json's vocab_size "
                f"{vocab_size}): the model can never emit it, so generation never stops on it")._replace(
                    severity=Severity.error))
    eos_token = _content(tokenizer.get("eos_token")) if tokenizer is not None else None
    pad_token = _content(tokenizer.get("pad_token")) if tokenizer is not None else None
    eos_id = by_token.get(eos_token) if eos_token is not None else None
    pad_id = by_token.get(pad_token) if pad_token is not None else None
    reasons = []
    if eos_id is not None or config_eos:
        if eos_id not in found and not set(config_eos or ()) & set(found):
            theirs = [f"the tokenizer's eos_token {_named(eos_id, ids)}"] if eos_id is not None else []
            theirs += [f"config.json's eos_token_id {_named_ids(config_eos, ids)}"] if config_eos else []
            reasons.append("includes neither " + " nor ".join(theirs) if len(theirs) > 1
                           else f"does not include {theirs[0]}")
    if pad_id is not None and eos_id is not None and pad_id != eos_id and set(found) == {pad_id}:
        reasons.append(f"is the tokenizer's pad token {_named(pad_id, ids)} alone")
    turn = _end_of_turn(_template(files, tokenizer), eos_token)
    turn_id = by_token.get(turn) if turn is not None else None
    if turn_id is not None and turn_id not in found and (eos_id is None or eos_id not in found):
        reasons.append(f"lacks the chat template's end-of-turn token {_named(turn_id, ids)}")
    if reasons:
        findings.append(make_finding(
            "CG128", source, f"eos_token_id {_named_ids(found, ids)} " + "; it ".join(reasons)
            + ": generation does not stop where the model ends its answer, and runs to the token limit"))
    return findings


def _json(files: Mapping[str, tuple[str, object]], name: str) -> dict[str, object] | None:
    value = files.get(name, ("", None))[1]
    return value if isinstance(value, dict) else None


def _ids(value: object) -> list[int] | None:
    """An ``eos_token_id``: an int or a list of ints (None, or anything else: nothing to compare)."""
    if type(value) is int:
        return [value]
    if isinstance(value, list) and value and all(type(v) is int for v in value):
        return list(value)
    return None


def _content(token: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken's ``{"content": ...}``."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) and token else None


def _vocabulary(files: Mapping[str, tuple[str, object]], tokenizer: dict[str, object] | None) -> dict[int, str]:
    """id -> content of the special tokens both files declare (tokenizer.json's added tokens, then
    tokenizer_config.json's ``added_tokens_decoder``)."""
    ids: dict[int, str] = {}
    added = files.get(TOKENIZER, ("", None))[1]
    for entry in added if isinstance(added, tuple) else ():
        ids.setdefault(entry[0], entry[1])
    decoder = tokenizer.get("added_tokens_decoder") if tokenizer is not None else None
    for key, entry in decoder.items() if isinstance(decoder, dict) else ():
        content = _content(entry)
        if key.isascii() and key.isdigit() and len(key) < 12 and content is not None:
            ids.setdefault(int(key), content)
    return ids


def _template(files: Mapping[str, tuple[str, object]], tokenizer: dict[str, object] | None) -> str:
    """The chat templates' text: chat_template.jinja, or tokenizer_config.json's ``chat_template`` (a string, or a
    list of named templates)."""
    jinja = files.get(CHAT_TEMPLATE, ("", None))[1]
    if isinstance(jinja, str):
        return jinja
    template = tokenizer.get("chat_template") if tokenizer is not None else None
    if isinstance(template, list):
        return "\n".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    return template if isinstance(template, str) else ""


def _end_of_turn(template: str, eos_token: str | None) -> str | None:
    """The token the template writes after each turn: a known end-of-turn token it spells, or the tokenizer's
    ``eos_token`` where it writes that variable (``{{ eos_token }}``); None without a template."""
    if not template:
        return None
    for token in END_OF_TURN:
        if token in template:
            return token
    return eos_token if "eos_token" in template else None


def _named(token_id: int | None, ids: Mapping[int, str]) -> str:
    token = ids.get(token_id) if token_id is not None else None
    return f"{token_id} ({shown(token)})" if token is not None else str(token_id)


SHOWN_IDS = 8  # a hostile config's list of a million ids: the message names the first few


def _named_ids(found: Iterable[int] | None, ids: Mapping[int, str]) -> str:
    items = [_named(i, ids) for i in found or ()]
    return items[0] if len(items) == 1 else _bounded(items)


def _list(found: list[int]) -> str:
    return str(found[0]) if len(found) == 1 else _bounded([str(i) for i in found])


def _bounded(items: list[str]) -> str:
    more = f", …(+{len(items) - SHOWN_IDS:,})" if len(items) > SHOWN_IDS else ""
    return "[" + ", ".join(items[:SHOWN_IDS]) + more + "]"
