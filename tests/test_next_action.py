"""Next-action evaluation (trainer/next_action.py): a produced turn against the reference's, the
report's counts and intervals, the prompts of long prefixes, and base vs adapter on a tiny real
model, the base scored with the adapter disabled."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tracefix.trainer.environment import Message, assistant_call, assistant_text
from tracefix.trainer.next_action import ActionMatch, fitted, reference_turns, same_action, score_actions, word_f1
from tracefix.trainer.rollouts import ChatTokens, Sampling

SCHEMA = {"type": "object", "properties": {"user_id": {"type": "string"}}, "required": ["user_id"]}
TOOLS = [{"tool_name": "get_user", "description": "Look a customer up.", "parameters": json.dumps(SCHEMA)}]


def tagged(*calls: str) -> Message:
    """An assistant turn of raw ``<tool_call>`` blocks, written exactly as given."""
    return {"role": "assistant", "content": "".join(f"<tool_call>{call}</tool_call>" for call in calls)}


def conversation(*turns: tuple[Message, list[Message]]) -> list[Message]:
    opening = [{"role": "system", "content": "You help customers."}, {"role": "user", "content": "I am U-1, please look me up."}]
    return opening + [message for assistant, following in turns for message in [assistant, *following]]


def test_a_call_with_the_same_arguments_in_another_key_order_matches() -> None:
    expected = tagged('{"name": "book", "arguments": {"flight": "LH1", "seat": {"row": 3, "side": "aisle"}, "bags": [1, 2]}}')
    produced = tagged('{"arguments": {"bags": [1, 2.0], "seat": {"side": "aisle", "row": 3}, "flight": "LH1"}, "name": "book"}')
    assert same_action(produced, expected) == ActionMatch("call", True, True, None)


@pytest.mark.parametrize(
    "arguments",
    ['{"flight": "LH2", "bags": [1, 2]}', '{"flight": "LH1", "bags": [2, 1]}', '{"flight": "LH1"}', '{"flight": "LH1", "bags": [true, 2]}', '"not an object"'],
    ids=["other value", "array order", "argument missing", "true is not 1", "not an object"],
)
def test_a_call_with_other_arguments_matches_the_tool_only(arguments: str) -> None:
    expected = assistant_call("book", {"flight": "LH1", "bags": [1, 2]})
    assert same_action(tagged(f'{{"name": "book", "arguments": {arguments}}}'), expected) == ActionMatch("call", False, True, None)


def test_a_call_where_the_reference_replied_or_a_reply_where_it_called_matches_nothing() -> None:
    call = assistant_call("get_user", {"user_id": "U-1"})
    reply = assistant_text("Found you, Ada.")
    assert same_action(call, reply) == ActionMatch("answer", False, False, 0.0)
    assert same_action(reply, call) == ActionMatch("call", False, False, None)
    # A malformed call is a failed call, not a reply.
    assert same_action(tagged('{"name": "get_user", "arguments": '), reply).match is False


def test_two_calls_in_a_turn_match_only_in_the_same_order() -> None:
    first, second = '{"name": "get_user", "arguments": {"user_id": "U-1"}}', '{"name": "get_booking", "arguments": {"id": 7}}'
    expected = tagged(first, second)
    assert same_action(tagged(first, second), expected) == ActionMatch("call", True, True, None)
    assert same_action(tagged(second, first), expected) == ActionMatch("call", False, False, None)
    assert same_action(tagged(first), expected) == ActionMatch("call", False, False, None)
    assert same_action(tagged(first, '{"name": "get_booking", "arguments": {"id": 8}}'), expected) == ActionMatch("call", False, True, None)


def test_a_reply_matches_a_reply_and_its_word_f1_is_kept_beside_the_match() -> None:
    # words: [the, flight, is, booked] against [your, flight, is, booked]: 3 shared, F1 = 2·3 / (4 + 4)
    assert same_action(assistant_text("The flight is booked."), assistant_text("Your flight is BOOKED!")) == ActionMatch("answer", True, True, 0.75)
    assert same_action(assistant_text("Nothing alike."), assistant_text("Goodbye!")) == ActionMatch("answer", True, True, 0.0)
    assert word_f1("booked booked", "booked") == pytest.approx(2 / 3)  # precision 1/2, recall 1
    assert word_f1("...", "!") == 1.0 and word_f1("", "Goodbye") == 0.0


def test_the_report_counts_turns_kinds_and_whole_conversations_with_wilson_intervals() -> None:
    call, call_tool_only = ActionMatch("call", True, True), ActionMatch("call", False, True)
    matches = [
        [call, call_tool_only, ActionMatch("answer", True, True, 0.5)],
        [ActionMatch("answer", True, True, 1.0)],
        [call, None],  # a skipped turn: the conversation counts for no whole-conversation figure
    ]
    report = score_actions(matches)
    assert report["turns"] == 5 and report["skipped"] == 1
    # Hand-computed Wilson intervals (z = 1.96): 4/5, 5/5, 2/3, 3/3, 2/2, 1/2.
    expected = {
        "matched": (4, 5, 0.8, [0.3755, 0.9638]),
        "tool_matched": (5, 5, 1.0, [0.5655, 1.0]),
        "call": (2, 3, 0.6667, [0.2077, 0.9385]),
        "call_tool": (3, 3, 1.0, [0.4385, 1.0]),
        "answer": (2, 2, 1.0, [0.3424, 1.0]),
        "conversations": (1, 2, 0.5, [0.0945, 0.9055]),
    }
    for key, (hits, total, rate, interval) in expected.items():
        assert (report[key]["hits"], report[key]["total"], report[key]["rate"]) == (hits, total, rate), key
        assert report[key]["interval"] == pytest.approx(interval, abs=1e-4), key
    assert report["mean_answer_f1"] == 0.75
    empty = score_actions([])
    assert empty["turns"] == 0 and empty["matched"]["interval"] == [0.0, 1.0] and empty["mean_answer_f1"] is None


def test_reference_turns_are_each_agent_turn_after_the_messages_before_it() -> None:
    messages = conversation(
        (assistant_call("get_user", {"user_id": "U-1"}), [{"role": "tool", "content": '{"name": "Ada"}'}]),
        (assistant_text("Found you, Ada."), [{"role": "user", "content": "Thanks, bye."}]),
        (assistant_text("Goodbye!"), []),
    )
    turns = reference_turns(messages)
    assert [len(prefix) for prefix, _ in turns] == [2, 4, 6]
    for prefix, expected in turns:
        assert prefix == messages[: len(prefix)] and expected is messages[len(prefix)] and expected["role"] == "assistant"
    assert [expected["content"] for _, expected in turns][1:] == ["Found you, Ada.", "Goodbye!"]


def test_a_long_prefix_loses_its_oldest_whole_turns_after_the_opening(smollm2_tokenizer: Any) -> None:
    chat = ChatTokens(smollm2_tokenizer)
    messages = conversation(
        (assistant_call("get_user", {"user_id": "U-1"}), [{"role": "tool", "content": '{"name": "Ada", "notes": "' + "long history " * 20 + '"}'}]),
        (assistant_text("Found you, Ada."), [{"role": "user", "content": "Thanks, bye."}]),
    )
    prefix = messages  # the prefix of a third agent turn
    whole = chat.opening(prefix)
    assert fitted(chat, prefix, len(whole)) == whole
    # One token short: the first agent turn and its tool result go, the opening and the rest stay.
    shorter = fitted(chat, prefix, len(whole) - 1)
    assert shorter == chat.opening([*prefix[:2], *prefix[4:]])
    assert "long history" not in smollm2_tokenizer.decode(shorter) and "I am U-1" in smollm2_tokenizer.decode(shorter)
    assert fitted(chat, prefix, len(chat.opening(prefix[:2])) - 1) is None


# -- on a tiny real model ------------------------------------------------------------------------------

SAMPLING = Sampling(max_new_tokens=6, temperature=1.0, max_length=2048)  # greedy whatever the temperature


@pytest.fixture(scope="module")
def tokenizer(wide_tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(wide_tiny_model)
    loaded.pad_token = loaded.pad_token or loaded.eos_token
    loaded.padding_side = "left"
    return loaded


@pytest.fixture(scope="module")
def plain(wide_tiny_model: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(wide_tiny_model).eval()


@pytest.fixture(scope="module")
def adapted(wide_tiny_model: Path) -> Any:
    """The same base with a LoRA adapter whose B matrices are seeded noise (a fresh one changes nothing)."""
    import peft  # noqa: F401  (installed by make test: never skipped)
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tests.lora_support import TARGETS

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(wide_tiny_model), LoraConfig(r=4, target_modules=TARGETS))
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return model


def _conversations(plain: Any, tokenizer: Any) -> list[list[Message]]:
    """Two stored conversations, three agent turns: a call, then the replies the plain base model
    itself writes there, so the base matches them word for word and another model need not."""
    from tracefix.router.protocol import stored_prompt_messages
    from tracefix.trainer.next_action import written

    call = {"role": "assistant", "content": "", "tool_calls": json.dumps([{"id": "c1", "name": "get_user", "arguments": {"user_id": "U-1"}}])}
    rows = [
        [{"role": "system", "content": "You help customers."}, {"role": "user", "content": "I am U-1, please look me up."}, call,
         {"role": "tool", "content": '{"name": "Ada"}', "tool_call_id": "c1"}],
        [{"role": "system", "content": "You help customers."}, {"role": "user", "content": "Which bags may I bring?"}],
    ]  # fmt: skip
    prefixes = [stored_prompt_messages(messages, TOOLS) for messages in rows]
    chat = ChatTokens(tokenizer)
    replies = written(plain, tokenizer, [fitted(chat, prefix, SAMPLING.max_length) for prefix in prefixes], SAMPLING.max_new_tokens)
    assert all(reply and word_f1(reply, reply) == 1.0 and "<tool_call>" not in reply for reply in replies), replies
    return [[*prefix, assistant_text(reply or "")] for prefix, reply in zip(prefixes, replies, strict=True)]


def test_the_base_is_scored_with_the_adapter_disabled_and_the_adapter_with_it(plain: Any, adapted: Any, tokenizer: Any) -> None:
    from tracefix.trainer.next_action import compare_next_actions, next_actions

    conversations = _conversations(plain, tokenizer)
    adapted.train()
    report = compare_next_actions(adapted, tokenizer, conversations, SAMPLING, batch=2)
    assert adapted.training  # the mode it came in
    base, adapter = report["base"], report["adapter"]
    assert report["turns"] == base["turns"] == adapter["turns"] == 3 and base["skipped"] == 0
    assert base["call"]["total"] == 1 and base["answer"]["total"] == 2
    # The base's report is the plain base model's: it writes the references' replies word for word.
    assert base == score_actions(next_actions(plain, tokenizer, conversations, SAMPLING))
    assert base["answer"]["hits"] == 2 and base["mean_answer_f1"] == 1.0
    # The adapter's noise changes what it writes.
    assert adapter["mean_answer_f1"] is not None and adapter["mean_answer_f1"] < 1.0
    difference = report["difference"]
    assert difference["rate"] == pytest.approx(adapter["matched"]["rate"] - base["matched"]["rate"], abs=1e-3)
    assert difference["base_only"] - difference["adapter_only"] == base["matched"]["hits"] - adapter["matched"]["hits"]
    assert difference["interval"][0] <= difference["rate"] <= difference["interval"][1] and 0.0 <= difference["mcnemar_p"] <= 1.0


def test_turns_whose_prompt_cannot_fit_are_skipped_and_counted(plain: Any, tokenizer: Any) -> None:
    from tracefix.trainer.next_action import next_actions

    conversations = [conversation((assistant_text("Hello."), [{"role": "user", "content": "Bye."}]), (assistant_text("Bye!"), []))]
    matches = next_actions(plain, tokenizer, conversations, Sampling(max_new_tokens=6, max_length=24))
    assert matches == [[None, None]]
    report = score_actions(matches)
    assert report["turns"] == 0 and report["skipped"] == 2 and report["conversations"]["total"] == 0


def test_retention_tells_whether_an_adapter_keeps_the_next_actions_of_the_weights_it_started_from(plain: Any, tokenizer: Any, tmp_path: Path) -> None:
    import copy

    import torch
    from peft import LoraConfig, get_peft_model

    from tracefix.daemon.core.settings import TrainingSettings
    from tracefix.router.protocol import stored_prompt_messages
    from tests.lora_support import TARGETS
    from tracefix.trainer.grpo import adapter_weights, lora_state
    from tracefix.trainer.conversations import conversation_sequence
    from tracefix.trainer.recipes import supervised
    from tracefix.trainer.train_job import retention

    opening = [{"role": "system", "content": "You help customers."}, {"role": "user", "content": "I am U-1, please look me up."}]
    call = {"role": "assistant", "content": "", "tool_calls": json.dumps([{"id": "c1", "name": "get_user", "arguments": {"user_id": "U-1"}}])}
    # The conversation scored on: the reference replied in text, as the plain base does.
    replied = [stored_prompt_messages([*opening, assistant_text("Found you.")], TOOLS)]
    # An adapter trained to call a tool at that turn instead (a tiny model learns to open a call in a hundred-odd updates),
    # from LoRA weights drawn the same whatever ran before (the trainer seeds only its own steps).
    torch.manual_seed(0)
    model = get_peft_model(copy.deepcopy(plain), LoraConfig(r=4, target_modules=TARGETS))
    generalist = lora_state(model)  # zero: the plain base
    config = TrainingSettings(warm_start_epochs=120, warm_start_batch=1, warm_start_learning_rate=5e-2, dtype="float32", threads=1)
    supervised(model, tokenizer, [conversation_sequence(tokenizer, stored_prompt_messages([*opening, call], TOOLS), 512)], config, tmp_path / "sft")
    calling = lora_state(model)
    forgot = retention(model, tokenizer, replied, SAMPLING, generalist, 0.05)
    assert forgot["forgets"] and (forgot["generalist"]["matched"]["rate"], forgot["adapter"]["matched"]["rate"]) == (1.0, 0.0)
    assert "held-out conversations 0.00 < the generalist's 1.00 by more than 0.05" in forgot["reason"]
    assert all(torch.equal(value, calling[name]) for name, value in lora_state(model).items())  # its own weights put back
    # The same adapter measured against the weights it has itself keeps every next action.
    kept = retention(model, tokenizer, replied, SAMPLING, calling, 0.0)
    assert not kept["forgets"] and kept["reason"] is None and kept["difference"]["rate"] == 0.0
    # And against its generalist with the margin wide enough, a loss is tolerated.
    with adapter_weights(model, calling):
        assert not retention(model, tokenizer, replied, SAMPLING, generalist, 1.0)["forgets"]


def _laid_out(tokenizer: Any, conversations: list[list[Message]]) -> tuple[list[list[int]], list[list[tuple[int, int]]]]:
    from tracefix.trainer.conversations import conversation_sequence
    from tracefix.trainer.next_action import agent_spans

    laid = [conversation_sequence(tokenizer, messages, SAMPLING.max_length) for messages in conversations]
    return [ids for ids, _ in laid], [agent_spans(mask) for _, mask in laid]


def test_agent_spans_are_the_runs_of_the_policy_mask() -> None:
    from tracefix.trainer.next_action import agent_spans

    assert agent_spans([0, 1, 1, 0, 0, 1, 0, 1]) == [(1, 3), (5, 6), (7, 8)]
    assert agent_spans([0, 0]) == [] and agent_spans([]) == []


def test_a_turn_the_model_writes_as_the_reference_is_read_off_the_teacher_forced_pass_and_one_that_departs_is_decoded_on(
    plain: Any, adapted: Any, tokenizer: Any
) -> None:
    from tracefix.trainer.next_action import forced_turns, next_actions, written_tokens

    conversations = _conversations(plain, tokenizer)
    sequences, spans = _laid_out(tokenizer, conversations)
    assert [len(row) for row in spans] == [2, 1]
    prompts = [sequence[:start] for sequence, row in zip(sequences, spans) for start, _ in row]
    for model, decoded in ((plain, 2), (adapted, 3)):
        forced = forced_turns(model, tokenizer, sequences, spans, SAMPLING.max_new_tokens, batch=2)
        # The same turns, token for token, as decoding each from its prompt.
        assert [turn for row in forced.turns for turn in row] == written_tokens(model, tokenizer, prompts, SAMPLING.max_new_tokens)
        # The base writes its first reply again as stored (nothing to decode), not the stored call, and not the second
        # reply's tokens: stored stripped, that reply lost the space its first token begins with. The noisy adapter departs everywhere.
        assert forced.decoded == decoded
        assert next_actions(model, tokenizer, conversations, SAMPLING, batch=2) == next_actions(model, tokenizer, conversations, SAMPLING, forced=False)


def test_a_turn_that_departs_mid_way_keeps_the_reference_tokens_before_it_and_stops_at_max_new_tokens(plain: Any, tokenizer: Any) -> None:
    from tracefix.trainer.next_action import forced_turns, written_tokens

    conversations = _conversations(plain, tokenizer)
    sequences, spans = _laid_out(tokenizer, conversations)
    # The base's own first reply with its second token changed: the base agrees on the first, departs at the second.
    sequence, (start, stop) = sequences[0], spans[0][1]
    changed = [*sequence[: start + 1], (sequence[start + 1] + 1) % 1000, *sequence[start + 2 :]]
    for budget in (1, 2, 4):
        forced = forced_turns(plain, tokenizer, [changed], [[(start, stop)]], budget)
        (turn,) = forced.turns[0]
        assert turn == written_tokens(plain, tokenizer, [changed[:start]], budget)[0]
        assert len(turn) <= budget and turn[0] == changed[start]
        assert forced.decoded == (1 if budget > 2 else 0)  # within two tokens nothing is left to decode
