"""WebShop: the embedded shop, the purchase reward, and the adapter to a WebShop server.

The real WebShop app (Flask, 1.2 GB of scraped products, Java for its Lucene index) is not installed here, so
the adapter is tested against a small HTTP server on 127.0.0.1 that serves pages in the official app's routes
and HTML structure (``/<session>``, ``/search_results/...``, ``/item_page/...``, ``/item_sub_page/...``,
``/done/...``), built from the embedded catalogue (``tests.helpers.webshop_site.OfficialFormatHandler``).
"""

from __future__ import annotations

import json
import random
import socket
import threading
from http.server import ThreadingHTTPServer

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taspo_trl.envs import get_env_factory
from taspo_trl.envs.webshop import (
    OraclePolicy,
    WebShopServerEnv,
    generate,
    load_catalog,
    parse_action,
    play,
    purchase_reward,
    webshop_env_factory,
    webshop_task_rows,
)
from taspo_trl.envs.webshop.catalog import DATA_DIR
from taspo_trl.envs.webshop.env import SEARCH_COMMAND
from tests.helpers.webshop_site import OfficialFormatHandler

# ---------------------------------------------------------------- reward, by hand

GOAL = {
    "query": "hair dryer",
    "product_category": "Beauty & Personal Care › Hair Care › Styling Tools › Hair Dryers",
    "nouns": ["hair", "dryer", "zorvex"],
    "attributes": ["travel size", "low noise", "long lasting"],
    "goal_options": {"color": "black"},
    "price_upper": 40.0,
}


def _product(**overrides):
    product = {
        "query": "hair dryer",
        "product_category": "Beauty & Personal Care › Hair Care › Styling Tools › Hair Dryers",
        "nouns": ["hair", "dryer", "kitro"],
        "Title": "Kitro Travel Size Hair Dryer",
        "Attributes": ["travel size", "low noise"],
        "BulletPoints": ["Folds flat."],
        "Description": "A small dryer.",
        "options": {"color": ["black", "white"]},
    }
    return {**product, **overrides}


def test_reward_two_of_three_attributes_wrong_option_over_budget():
    # r_type = 1 (same query); attributes 2/3 ("long lasting" appears nowhere); option white != black; 45 > 40.
    # (2 + 0 + 0) / (3 attributes + 1 option + 1) = 0.4
    assert purchase_reward(_product(), GOAL, 45.0, {"color": "white"}) == pytest.approx(0.4)


def test_reward_full_match_and_text_fallbacks():
    assert purchase_reward(_product(), GOAL, 45.0, {}) == pytest.approx(2 / 5)  # no option chosen counts 0
    # "long lasting" found in the description; the option chosen and the price right: 5/5.
    product = _product(Description="A long lasting dryer.")
    assert purchase_reward(product, GOAL, 39.99, {"color": "black"}) == pytest.approx(1.0)
    # Colours match fuzzily (word sets): "jet black" contains "black".
    assert purchase_reward(product, GOAL, 39.99, {"color": "jet black"}) == pytest.approx(1.0)


def test_reward_sizes_match_exactly():
    goal = {**GOAL, "goal_options": {"size": "x-large"}}
    product = _product(Description="A long lasting dryer.")
    # size "large" != "x-large" (exact match only, and "large" is in no text): (3 + 0 + 1) / 5
    assert purchase_reward(product, goal, 10.0, {"size": "large"}) == pytest.approx(0.8)
    assert purchase_reward(product, goal, 10.0, {"size": "x-large"}) == pytest.approx(1.0)


def test_reward_type_rules():
    other = {"query": "lipstick", "product_category": "Beauty & Personal Care › Makeup › Lips"}
    # Only "Beauty & Personal Care" is shared (needs 2 levels); nouns share nothing -> r_type 0.
    assert purchase_reward(_product(**other, nouns=["lipstick", "kitro"]), GOAL, 10.0, {"color": "black"}) == 0.0
    # 1 of 3 goal nouns (0.33 > 0.2) -> r_type 1 even without query or category match: (2 + 1 + 1) / 5.
    assert purchase_reward(_product(**other, nouns=["dryer"]), GOAL, 10.0, {"color": "black"}) == pytest.approx(0.8)
    # 1 of 5 nouns = 0.2 (not > 0.2), no query/category match -> 0.5; 1 of 11 < 0.1 -> 0.1.
    five = {**GOAL, "nouns": ["hair", "dryer", "zorvex", "diffuser", "kit"]}
    assert purchase_reward(_product(**other, nouns=["kit"]), five, 10.0, {"color": "black"}) == pytest.approx(0.5 * 4 / 5)
    eleven = {**GOAL, "nouns": [f"n{i}" for i in range(10)] + ["kit"]}
    assert purchase_reward(_product(**other, nouns=["kit"]), eleven, 10.0, {"color": "black"}) == pytest.approx(0.1 * 4 / 5)
    # Two shared category levels are enough for r_type 1 at title score 0.2.
    near = {"query": "diffuser", "product_category": "Beauty & Personal Care › Hair Care › Accessories"}
    assert purchase_reward(_product(**near, nouns=["kit"]), five, 10.0, {"color": "black"}) == pytest.approx(4 / 5)


# ---------------------------------------------------------------- embedded shop


def test_oracle_wins_every_eval_goal_and_random_policy_scores_low():
    catalog = load_catalog()
    scores, random_scores = [], []
    queries = sorted({p["query"] for p in catalog.products})
    rng = random.Random(0)

    def random_policy(admissible):
        action = rng.choice(admissible)
        return f"search[{rng.choice(queries)}]" if action == SEARCH_COMMAND else action

    for index, goal in enumerate(catalog.goals["eval"]):
        _, info = play(webshop_env_factory({"goal_index": index, "split": "eval"}), OraclePolicy(goal))
        scores.append(info["score"])
        assert info["won"] and not info["truncated"]
        _, info = play(webshop_env_factory({"goal_index": index, "split": "eval"}), random_policy)
        random_scores.append(info["score"])
    assert len(scores) == 128 and min(scores) == 1.0
    assert sum(random_scores) / len(random_scores) < 0.2


def test_pages_and_admissible_commands():
    env = webshop_env_factory({"goal_index": 0, "split": "eval"})
    goal = env.goal
    first = env.reset()
    assert first.startswith("WebShop [SEP] Instruction: [SEP] ") and goal["instruction_text"] in first
    assert env.admissible_commands == [SEARCH_COMMAND]
    assert (env.action_tag, env.env_name, env.max_turns, env.task_type) == ("action", "webshop", 15, goal["category"])
    assert "search[" in env.instructions and env.task == goal["instruction_text"]
    result = env.step(f"search[{goal['query']}]")
    assert "Page 1 (Total results: " in result.observation and "click[back to search]" in env.admissible_commands
    assert result.info["admissible_commands"] == env.admissible_commands
    # Page through the results until the goal product shows up.
    while f"click[{goal['asin'].lower()}]" not in env.admissible_commands:
        env.step("click[next >]")
    page = env.step(f"click[{goal['asin']}]").observation  # targets are case-insensitive, as in WebShop
    product = env.catalog.by_asin[goal["asin"]]
    assert product["Title"] in page and f"Price: {product['Price']}" in page and page.endswith("Buy Now")
    for clickable in ("back to search", "< prev", "description", "features", "reviews", "buy now"):
        assert f"click[{clickable}]" in env.admissible_commands
    assert env.step("click[features]").observation.endswith(" [SEP] ".join(product["BulletPoints"]))
    assert env.admissible_commands == ["click[back to search]", "click[< prev]"]
    env.step("click[< prev]")
    value = next(iter(goal["goal_options"].values()))
    assert env.step(f"click[{value}]").observation.startswith(f"You have clicked {value}.")
    done = env.step("click[buy now]")
    assert done.done and 0.0 <= done.reward <= 1.0 and done.info["score"] == done.reward
    assert "Your score (min 0.0, max 1.0)" in done.observation and env.admissible_commands == []
    assert done.info["purchase"]["asin"] == goal["asin"] and done.info["purchase"]["options"] == {
        next(iter(goal["goal_options"])): value
    }
    again = env.step("click[buy now]")  # after the end: same page, no reward
    assert again.done and again.reward == 0.0 and again.observation == done.observation


def test_max_turns_truncates():
    env = webshop_env_factory({"goal_index": 3, "split": "train", "max_turns": 4})
    env.reset()
    results = [env.step("click[nothing]") for _ in range(4)]
    assert [r.done for r in results] == [False, False, False, True]
    assert results[-1].info == {**results[-1].info, "truncated": True, "won": False, "score": 0.0, "turn": 4}
    assert env.step("click[nothing]").info["truncated"]  # stays so after the end


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        ("", "no action given"),
        ("buy the hair dryer", "is not an action"),
        ("click[unknown thing]", "is not clickable on this page"),
        ("click[]", "click needs a target"),
        ("search[   ]", "the search query is empty"),
        ("Click[buy now]", "unknown action 'Click'; write click[...]"),
        ("jump[up]", "unknown action 'jump'"),
        ("click[search]", "is not clickable"),
    ],
)
def test_malformed_actions_get_the_unchanged_page(action, reason):
    env = webshop_env_factory({"goal_index": 1, "split": "eval"})
    page = env.reset()
    result = env.step(action)
    assert result.observation == f"Invalid action: {result.observation.split(': ', 1)[1].split(chr(10))[0]}\n{page}"
    assert reason in result.observation.split("\n")[0]
    assert result.reward == 0.0 and not result.done and result.info["turn"] == 1


def test_search_needs_the_search_page_and_odd_queries_work():
    env = webshop_env_factory({"goal_index": 1, "split": "eval"})
    env.reset()
    long_page = env.step("search[" + "dryer " * 5000 + "]").observation  # clipped, not refused
    assert long_page.startswith("Back to Search [SEP] Page 1")
    refused = env.step("search[hair dryer]")
    assert refused.observation == f"Invalid action: there is no search box on this page; click[back to search] first.\n{long_page}"
    env.step("click[back to search]")
    odd = env.step("search[sèche-cheveux 吹风机 🙂]").observation
    assert "Total results: 0" in odd and env.admissible_commands == ["click[back to search]"]
    assert parse_action("click[ Buy  Now ]") == ("click", " Buy  Now ")


def _prefixes():
    """Episodes stopped on each kind of page: search, results, item, a sub-page, done."""
    goal_index = 5
    goal = load_catalog().goals["eval"][goal_index]
    env = webshop_env_factory({"goal_index": goal_index, "split": "eval"})
    policy = OraclePolicy(goal)
    env.reset()
    actions = []
    while True:
        action = policy(env.admissible_commands)
        actions.append(action)
        if env.step(action).done:
            break
    opened = actions.index(f"click[{goal['asin'].lower()}]") + 1
    prefixes = [actions[:k] for k in range(len(actions))] + [actions[:opened] + ["click[description]"], actions]
    return goal_index, prefixes


GOAL_INDEX, PREFIXES = _prefixes()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prefix=st.sampled_from(PREFIXES), text=st.one_of(
    st.text(max_size=300),
    st.builds(lambda n, a: f"{n}[{a}]", st.sampled_from(["click", "search", "Click", "SEARCH", ""]), st.text(max_size=80)),
))
def test_arbitrary_text_never_raises(prefix, text):
    env = webshop_env_factory({"goal_index": GOAL_INDEX, "split": "eval"})
    page = env.reset()
    for action in prefix:
        page = env.step(action).observation
        assert not page.startswith("Invalid action")
    before, was_done = env.admissible_commands, env._done
    result = env.step(text)
    assert isinstance(result.observation, str) and 0.0 <= result.reward <= 1.0
    if was_done:
        assert result.done and result.observation == page and result.reward == 0.0
        return
    name, argument = parse_action(text)
    valid = (name == "search" and SEARCH_COMMAND in before and argument is not None and argument.strip()) or (
        name == "click" and argument is not None and f"click[{' '.join(argument.split()).lower()}]" in before
    )
    if not valid:
        assert result.observation.startswith("Invalid action: ") and result.observation.endswith("\n" + page)
        assert env.admissible_commands == before


# ---------------------------------------------------------------- determinism, data, rows


def test_same_seed_same_world_and_pages():
    assert generate(1) == generate(1) and generate(1) != generate(2)
    shipped = json.loads((DATA_DIR / "products.json").read_text())
    products, goals = generate(0)
    assert shipped["products"] == products and len(products) == 600
    assert json.loads((DATA_DIR / "goals.json").read_text())["eval"] == goals["eval"] and len(goals["eval"]) == 128
    assert len({p["asin"] for p in products}) == len(products)
    assert sum((DATA_DIR / name).stat().st_size for name in ("products.json", "goals.json")) < 2_000_000

    def pages(seed):
        env = webshop_env_factory({"goal_index": 7, "split": "train", "seed": seed})
        observations = [env.reset()]
        policy = OraclePolicy(env.goal)
        for _ in range(env.max_turns):
            result = env.step(policy(env.admissible_commands))
            observations.append(result.observation)
            if result.done:
                break
        return observations, result.info["score"]

    assert pages(3) == pages(3) and pages(3)[1] == 1.0 and pages(3) != pages(4)


def test_task_rows_and_registry():
    rows = webshop_task_rows(split="eval")
    assert rows == webshop_task_rows(split="test")  # WebShop's name for its fixed evaluation goals
    assert len(rows) == 128 and len(webshop_task_rows(split="train", max_tasks=5)) == 5
    spec = json.loads(rows[9]["prompt"])
    assert spec["env"] == "webshop" and rows[9]["task_type"] == spec["task_type"]
    env = get_env_factory("webshop")(spec)
    env.reset()
    assert env.task == spec["task"] == load_catalog().goals["eval"][9]["instruction_text"]
    with pytest.raises(ValueError, match="split"):
        webshop_task_rows(split="nope")
    with pytest.raises(ValueError, match="goal_index"):
        webshop_env_factory({"split": "eval"})
    with pytest.raises(ValueError, match="out of range"):
        webshop_env_factory({"goal_index": 128, "split": "eval"})
    with pytest.raises(ValueError, match="url="):
        webshop_task_rows(source="official")


# ---------------------------------------------------------------- a server in the official format


@pytest.fixture(scope="module")
def official_url():
    OfficialFormatHandler.catalog = load_catalog()
    server = ThreadingHTTPServer(("127.0.0.1", 0), OfficialFormatHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_server_adapter_matches_the_embedded_shop(official_url):
    catalog = load_catalog()
    for index in range(12):
        goal = catalog.goals["eval"][index]
        embedded = webshop_env_factory({"goal_index": index, "split": "eval"})
        remote = webshop_env_factory({"goal_index": index, "url": official_url, "task_type": goal["category"]})
        assert isinstance(remote, WebShopServerEnv)
        assert embedded.reset() == remote.reset() and remote.task == goal["instruction_text"]
        policy = OraclePolicy(goal)
        actions = [] if index % 3 else ["click[nope]", "search[sèche 吹风机]", "click[back to search]"]
        for _ in range(embedded.max_turns):
            action = actions.pop(0) if actions else policy(embedded.admissible_commands)
            mine, theirs = embedded.step(action), remote.step(action)
            assert sorted(embedded.admissible_commands) == sorted(remote.admissible_commands)
            if not mine.done:
                assert mine.observation == theirs.observation
            assert (mine.reward, mine.done) == pytest.approx((theirs.reward, theirs.done))
            if mine.done:
                break
        assert theirs.info["won"] and theirs.info["score"] == pytest.approx(1.0)
    # Sub-pages, "< prev" and a wrong option through the server, against the embedded reward.
    remote = webshop_env_factory({"goal_index": 0, "url": official_url})
    embedded = webshop_env_factory({"goal_index": 0, "split": "eval"})
    goal = embedded.goal
    for env in (remote, embedded):
        env.reset()
        env.step(f"search[{goal['query']}]")
        while f"click[{goal['asin'].lower()}]" not in env.admissible_commands:
            env.step("click[next >]")
        env.step(f"click[{goal['asin'].lower()}]")
        env.step("click[description]")
        assert env.step("click[< prev]").observation.endswith("Buy Now")
        wrong = next(v for v in catalog.by_asin[goal["asin"]]["options"]["color"] if v != goal["goal_options"]["color"])
        env.step(f"click[{wrong}]")
    bought = remote.step("click[buy now]").reward
    assert bought == pytest.approx(embedded.step("click[buy now]").reward) and 0.0 < bought < 1.0


def test_task_rows_from_a_server(official_url):
    rows = webshop_task_rows(source="official", split="eval", max_tasks=3, url=official_url)
    specs = [json.loads(row["prompt"]) for row in rows]
    assert [s["goal_index"] for s in specs] == [0, 1, 2] and all(s["url"] == official_url for s in specs)
    assert specs[2]["task"] == load_catalog().goals["eval"][2]["instruction_text"]
    # A url alone (the CLI's default source is "embedded") selects the server's goals.
    assert json.loads(webshop_task_rows(split="eval", max_tasks=1, url=official_url)[0]["prompt"])["url"] == official_url


def test_server_failures_end_the_episode_without_raising(official_url):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    env = webshop_env_factory({"goal_index": 0, "url": dead})
    assert env.reset().startswith("WebShop error: could not reach the WebShop server")
    result = env.step("search[hair dryer]")
    assert result.done and result.reward == 0.0 and "error" in result.info and env.admissible_commands == []
    with pytest.raises(ConnectionError):
        webshop_task_rows(source="official", split="eval", max_tasks=1, url=dead)

    env = webshop_env_factory({"goal_index": 0, "url": official_url})
    env.reset()
    failed = env.step("search[explode]")
    assert failed.done and "HTTP 500" in failed.observation and failed.info["score"] == 0.0

    slow = WebShopServerEnv(official_url, 0, timeout=0.3)
    slow.reset()
    timed_out = slow.step("search[sleep]")
    assert timed_out.done and timed_out.info["error"].startswith("could not reach")
    with pytest.raises(ValueError, match="http"):
        webshop_env_factory({"goal_index": 0, "url": "ftp://example"})


# ---------------------------------------------------------------- through the agent loop


def test_agent_loop_plays_webshop(embedded_tokenizer):
    from tests.helpers.toy_envs import ScriptedGenerator

    from taspo_trl.envs.base import task_spec_from_row
    from taspo_trl.rollout.chat import ChatFormat
    from taspo_trl.rollout.env_pool import EnvPool
    from taspo_trl.rollout.loop import run_agent_loop

    row = webshop_task_rows(split="eval", max_tasks=3)[2]
    spec = task_spec_from_row(row)
    env = webshop_env_factory(spec)
    policy, actions = OraclePolicy(env.goal), []
    env.reset()
    while True:
        actions.append(policy(env.admissible_commands))
        if env.step(actions[-1]).done:
            break
    responses = [f"<think>next</think> <action>{action}</action>" for action in actions]
    pool = EnvPool(get_env_factory("webshop"), num_workers=0)
    generator = ScriptedGenerator(embedded_tokenizer, ["no tag here", *responses])
    try:
        [trajectory] = run_agent_loop([spec], pool, generator, ChatFormat(embedded_tokenizer))
    finally:
        pool.shutdown()
    assert trajectory.won and trajectory.reward == pytest.approx(1.0) and trajectory.num_turns == len(actions) + 1
    assert trajectory.turns[0].observation.startswith("Invalid action: no action given")
    assert trajectory.task_type == env.task_type
