"""The batched agent loop and the row layouts, on a small deterministic environment."""

from __future__ import annotations

import pytest
import torch

from taspo_trl.envs.base import PromptTemplate, task_spec_from_row
from taspo_trl.rollout.chat import ChatFormat
from taspo_trl.rollout.env_pool import EnvPool
from taspo_trl.rollout.layouts import NOT_POLICY, build_rows
from taspo_trl.rollout.loop import run_agent_loop
from tests.helpers.toy_envs import QuizEnv, ScriptedGenerator, locker_factory, quiz_factory

GOOD = "<think>The key is in locker 3.</think> <action>open locker 3</action>"
WRONG = "<think>Try the first one.</think> <action>open locker 1</action>"
NO_TAG = "I will open locker 3 now."
TWO_TAGS = "<action>open locker 1</action><action>open locker 3</action>"


@pytest.fixture()
def chat(embedded_tokenizer):
    return ChatFormat(embedded_tokenizer)


def _run(chat, responses, specs, layout="turn", workers=0, **kwargs):
    pool = EnvPool(locker_factory, num_workers=workers)
    generator = ScriptedGenerator(chat.tokenizer, responses)
    try:
        trajectories = run_agent_loop(specs, pool, generator, chat, layout=layout, **kwargs)
    finally:
        pool.shutdown()
    return trajectories, generator


def test_one_batched_generate_call_per_turn(chat):
    # Targets 1 and 3 win at turn 1 and 2; target 5 never wins and runs out at max_turns=4.
    specs = [{"target": 1}, {"target": 3}, {"target": 5}, {"target": 3}]
    trajectories, generator = _run(chat, [WRONG, GOOD], specs)
    assert generator.calls == [4, 3, 1, 1]  # all live trajectories in one call, finished ones drop out
    assert [t.num_turns for t in trajectories] == [1, 2, 4, 2]
    assert [t.won for t in trajectories] == [True, True, False, True]
    assert [t.reward for t in trajectories] == [1.0, 1.0, 0.0, 1.0]
    assert trajectories[2].truncated and not trajectories[1].truncated


def test_malformed_actions_are_normal_turns(chat):
    trajectories, _ = _run(chat, [NO_TAG, TWO_TAGS, GOOD], [{"target": 3}], invalid_action_penalty=0.1)
    turns = trajectories[0].turns
    assert [t.action_valid for t in turns] == [False, False, True]
    assert [t.action_reason for t in turns[:2]] == ["no_tag", "multiple_tags"]
    assert turns[0].observation == "Nothing happens." and turns[0].action == ""
    assert turns[0].action_span == (0, 0)
    assert trajectories[0].won and trajectories[0].reward == pytest.approx(1.0 - 2 * 0.1)


def test_action_span_covers_the_block(chat):
    trajectories, _ = _run(chat, [GOOD], [{"target": 3}])
    turn = trajectories[0].turns[0]
    start, end = turn.action_span
    text = chat.tokenizer.decode(turn.response_ids[start:end])
    assert "<action>open locker 3</action>" in text
    assert "<think>" not in text


def test_environment_crash_ends_only_that_episode(chat):
    specs = [{"target": 3, "crash_on": "open locker 1"}, {"target": 1}]
    trajectories, _ = _run(chat, [WRONG], specs)
    crashed, fine = trajectories
    assert crashed.error and "simulated environment crash" in crashed.error
    assert crashed.reward == 0.0 and not crashed.won and crashed.num_turns == 1
    assert fine.won and fine.error is None


def test_worker_processes_match_in_process(chat):
    specs = [{"target": t} for t in (1, 3, 5, 2)]
    local, _ = _run(chat, [WRONG, GOOD], specs)
    pooled, _ = _run(chat, [WRONG, GOOD], specs, workers=2)
    assert [t.to_dict() for t in local] == [t.to_dict() for t in pooled]


def test_turn_limit_and_prompt_limit(chat):
    trajectories, _ = _run(chat, [WRONG], [{"target": 3, "max_turns": 10}], max_turns=2)
    assert trajectories[0].num_turns == 2 and trajectories[0].truncated
    trajectories, _ = _run(chat, [WRONG], [{"target": 3}], max_prompt_tokens=5)
    assert trajectories[0].num_turns == 0 and trajectories[0].truncated


def test_turn_prompts_show_a_bounded_history_window(chat):
    template = PromptTemplate(history_window=2)
    trajectories, _ = _run(chat, [WRONG], [{"target": 3, "max_turns": 4}], template=template)
    last = trajectories[0].turns[-1].prompt_text
    assert "[Step 2]" in last and "[Step 3]" in last and "[Step 1]" not in last
    assert "Admissible actions: 'open locker 1'" in last


def test_sequence_rows_are_the_exact_history(chat):
    trajectories, _ = _run(chat, [WRONG, WRONG, GOOD], [{"target": 3}, {"target": 1}], layout="sequence")
    rows = build_rows(trajectories, "sequence")
    assert len(rows) == 2  # one row per trajectory
    for row, trajectory in enumerate(trajectories):
        last = trajectory.turns[-1]
        full = rows.prompt_ids[row] + rows.completion_ids[row]
        # the last turn's prompt + response is exactly the row: nothing was re-tokenised differently
        assert full == last.prompt_ids + last.response_ids
        policy = [tok for tok, m in zip(rows.completion_ids[row], rows.env_mask[row]) if m == 1]
        assert policy == [tok for turn in trajectory.turns for tok in turn.response_ids]
        assert sum(rows.env_mask[row]) == sum(len(t.response_ids) for t in trajectory.turns)
        assert all((m == 1) == (t != NOT_POLICY) for m, t in zip(rows.env_mask[row], rows.token_turn[row]))


def test_turn_rows_pad_to_a_multiple(chat):
    trajectories, _ = _run(chat, [WRONG, GOOD], [{"target": 3}, {"target": 1}, {"target": 3}])
    rows = build_rows(trajectories, "turn", pad_to_multiple=4)
    real = sum(t.num_turns for t in trajectories)  # 2 + 1 + 2 = 5 turns -> padded to 8 rows
    assert real == 5 and len(rows) == 8
    assert rows.row_trajectory[5:] == [NOT_POLICY] * 3
    assert all(sum(m) == 0 for m in rows.env_mask[5:])
    per_turn = [[10 * i + t for t in range(tr.num_turns)] for i, tr in enumerate(trajectories)]
    spread = rows.spread(per_turn)
    assert spread[0] == [0.0] * len(rows.completion_ids[0])  # trajectory 0, turn 0 -> value 0
    assert set(spread[1]) == {1.0}  # trajectory 0, turn 1
    assert set(spread[3]) == {20.0}  # trajectory 2, turn 0


def test_task_spec_from_row():
    assert task_spec_from_row({"prompt": '{"game_file": "a.tw-pddl"}', "task_type": "pick"}) == {
        "game_file": "a.tw-pddl",
        "task_type": "pick",
    }
    assert task_spec_from_row({"prompt": "plain text", "game_file": "b"}) == {"game_file": "b"}
    with pytest.raises(ValueError, match="encode_task_prompt"):
        task_spec_from_row({"prompt": "plain text"})


def test_chat_format_rejects_a_tokenizer_without_template(embedded_model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_path)
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        ChatFormat(tokenizer)


def test_sampling_logprobs_match_a_forward_pass(tiny_model_dir, chat):
    """The generator's recorded log-probs are log_softmax(logits / T) at the sampled tokens."""
    from transformers import AutoModelForCausalLM

    from taspo_trl.rollout.generation import TransformersGenerator

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    generator = TransformersGenerator(model, chat.tokenizer, max_new_tokens=12, temperature=0.7)
    prompts = [chat.first_prompt_ids("open the locker"), chat.first_prompt_ids("a longer prompt with more words in it")]
    for prompt, gen in zip(prompts, generator(prompts)):
        assert len(gen.token_ids) == len(gen.logprobs) > 0
        ids = torch.tensor([prompt + gen.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1] / 0.7
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(gen.token_ids)[:, None]).squeeze(1)
        assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=1e-4)


def test_autocast_generation_samples_in_bf16_and_records_its_log_probs(tiny_model_dir, chat):
    """With ``autocast_dtype`` the model's matmuls run in bfloat16 during sampling (as the trainer's bf16 forward
    passes do), and the recorded log-probs are those of that bf16 forward pass, not the float32 one."""
    from transformers import AutoModelForCausalLM

    from taspo_trl.rollout.generation import TransformersGenerator

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    seen = set()
    model.lm_head.register_forward_hook(lambda module, args, out: seen.add(out.dtype))
    generator = TransformersGenerator(model, chat.tokenizer, max_new_tokens=8, temperature=1.0,
                                      autocast_dtype=torch.bfloat16)
    prompt = chat.first_prompt_ids("open the locker")
    [gen] = generator([prompt])
    assert seen == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in model.parameters())  # autocast leaves the weights alone
    ids = torch.tensor([prompt + gen.token_ids])
    taken = torch.tensor(gen.token_ids)[:, None]
    with torch.no_grad():
        exact = torch.log_softmax(model(ids).logits[0, len(prompt) - 1 : -1].float(), -1).gather(1, taken).squeeze(1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = torch.log_softmax(model(ids).logits[0, len(prompt) - 1 : -1].float(), -1).gather(1, taken).squeeze(1)
    recorded = torch.tensor(gen.logprobs)
    assert torch.allclose(recorded, mixed, atol=0.05)
    assert (recorded - exact).abs().max() > 1e-4  # bf16 rounding shows: the float32 pass was not the one recorded


def test_multi_tag_environment_gets_canonical_blocks_in_batched_steps(chat):
    QuizEnv.batch_sizes.clear()
    pool = EnvPool(quiz_factory)
    responses = ["<think>Not sure.</think> <LOOK> capital </LOOK>", "<think>Got it.</think><answer>Quizville</answer>"]
    generator = ScriptedGenerator(chat.tokenizer, responses)
    try:
        trajectories = run_agent_loop([{}, {}, {}], pool, generator, chat)
    finally:
        pool.shutdown()
    assert QuizEnv.batch_sizes == [3, 3]  # one step_many call per turn over all live episodes
    assert [t.action for t in trajectories[0].turns] == ["<look>capital</look>", "<answer>Quizville</answer>"]
    assert all(t.won for t in trajectories)
    prompt = trajectories[0].turns[0].prompt_text
    assert "Look things up with <look> topic </look>." in prompt
    assert "<look> </look> or <answer> </answer>" in prompt


def test_action_span_uses_the_environments_own_tags(chat):
    # The locker environment answers in <action>; a <search> block written before it is reasoning, not the action
    # that was sent, so the span (what TASPO scores) covers the <action> block only.
    text = "<search>where is the key</search> <action>open locker 3</action>"
    trajectories, _ = _run(chat, [text], [{"target": 3}])
    turn = trajectories[0].turns[0]
    assert turn.action == "open locker 3"
    start, end = turn.action_span
    located = chat.tokenizer.decode(turn.response_ids[start:end])
    assert "<action>open locker 3</action>" in located
    assert "search" not in located
