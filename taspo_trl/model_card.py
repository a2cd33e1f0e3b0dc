"""The model card (``README.md``) that a run's output folder gets: the real base model, the method and its paper,
the recipe, and the run's own figures.

TRL's card template assumes a Hub model: for a local folder it names the base model ``None`` and shows a generic
chat question. A taspo-trl run usually starts from a local folder (the embedded model or its warm start, converted
into the model cache), so the card here names the Hub model that folder was made from, and shows how to play the
trained agent on its environment.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

from .models import EMBEDDED_HUB_ID, embedded_model_dir, is_embedded
from .provenance import package_versions

# Settings every card lists when set: the run length and the sampling, as a reader of a results table asks for them.
_HEADLINE_SETTINGS = (
    "environment", "layout", "max_steps", "num_generations", "max_turns", "max_completion_length", "temperature",
    "learning_rate", "beta", "loss_type", "seed",
)
# Output, logging and hub fields say where a run went, not how it trained.
_NOT_RECIPE = ("output_dir", "logging_dir", "run_name", "hub_", "push_to_hub", "report_to", "logging_", "save_",
               "overwrite_output_dir", "resume_from_checkpoint", "eval_", "dataloader_", "disable_tqdm")


def base_model_origin(name_or_path: str) -> tuple[str | None, str | None]:
    """``(hub_id, warm_start)``: the Hub model that ``name_or_path`` was made from, where it can be told (a Hub id
    is its own; the embedded model's cache folder is HuggingFaceTB/SmolLM2-135M-Instruct; a warm start's folder is
    its base model's, and its warm-start name is the second item), else ``None``."""
    if is_embedded(name_or_path):
        return EMBEDDED_HUB_ID, None
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        return (name_or_path or None), None
    if path.resolve() == embedded_model_dir().resolve():
        return EMBEDDED_HUB_ID, None
    record = path / "warm_start.json"
    if record.is_file():
        data = json.loads(record.read_text())
        base = data["fingerprint"]["settings"]["base_model"]
        return base_model_origin(base)[0], data.get("name")
    return None, None


def recipe_settings(args: Any) -> dict[str, Any]:
    """The plain-valued fields of a trainer config ``args`` that differ from the config class's defaults, leaving
    out where the run wrote and logged (what another user needs to train the same way)."""
    defaults = {}
    for field in dataclasses.fields(args):
        if field.default is not dataclasses.MISSING:
            defaults[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            defaults[field.name] = field.default_factory()
    changed = {}
    for name, value in sorted(vars(args).items()):
        if name not in defaults or name.startswith(_NOT_RECIPE) or value == defaults[name] or value in ([], {}):
            continue
        if isinstance(value, (str, int, float, bool, list, tuple, type(None))):  # not objects TRL fills in itself
            changed[name] = value
    return changed


def last_metrics(log_history: list[dict[str, Any]]) -> dict[str, float]:
    """The agent's figures of the last logged training step (success, reward, turns; a family absent from that
    step is absent here) and of the last evaluation, if any."""
    last_train = next((entry for entry in reversed(log_history) if "reward" in entry), {})
    last_eval = next((entry for entry in reversed(log_history) if any(k.startswith("eval_") for k in entry)), {})
    wanted = ("success/", "reward", "env/turns_mean")
    figures = {k: v for k, v in last_train.items() if k.startswith(wanted) and isinstance(v, (int, float))}
    figures.update({k: v for k, v in last_eval.items() if k.startswith("eval_") and isinstance(v, (int, float))})
    return figures


def _trl_base(trainer: Any) -> str:
    """The TRL trainer class the run's trainer builds on (``GRPOTrainer``, ``SFTTrainer``)."""
    return next((cls.__name__ for cls in type(trainer).__mro__ if cls.__module__.startswith("trl.")), "Trainer")


def render_model_card(trainer: Any, model_name: str, folder: str, dataset_name: str | None = None,
                      tags: list[str] | None = None) -> ModelCard:
    """The card of the model that ``trainer`` saved to ``folder``, named ``model_name``."""
    from trl.trainer.utils import get_config_model_id

    args = trainer.args
    hub_id, warm_start = base_model_origin(get_config_model_id(trainer.model.config) or "")
    is_adapter = (Path(folder) / "adapter_config.json").is_file()
    card_data = ModelCardData(
        base_model=hub_id,
        datasets=dataset_name,
        library_name="peft" if is_adapter else "transformers",
        model_name=model_name,
        pipeline_tag="text-generation",
        tags=sorted({"generated_from_trainer", *trainer._tag_names, *(tags or [])}),
    )
    environment = getattr(args, "environment", None)
    method = trainer._name
    if hub_id and warm_start:
        origin = f"[{hub_id}](https://huggingface.co/{hub_id}) after the `{warm_start}` warm start (SFT on expert demonstrations)"
    elif hub_id:
        origin = f"[{hub_id}](https://huggingface.co/{hub_id})"
    else:
        origin = f"the local model `{get_config_model_id(trainer.model.config)}`"
    lines = [
        "---", card_data.to_yaml(), "---", "",
        f"# {model_name}", "",
        f"A multi-turn agent{f' for {environment}' if environment else ''}: {origin} trained with **{method}**"
        f"{' as a LoRA adapter' if is_adapter else ''}, using [taspo-trl](https://pypi.org/project/taspo-trl/) "
        f"on [TRL](https://github.com/huggingface/trl)'s `{_trl_base(trainer)}`.", "",
    ]
    paper = getattr(trainer, "_paper", {}) or {}
    if paper.get("title"):
        link = f"[{paper['title']}](https://huggingface.co/papers/{paper['id']})" if paper.get("id") else f"*{paper['title']}*"
        lines += [f"The method is from {link}.", ""]
    lines += ["## Play it", "", "```bash", f"taspo-eval --model_name_or_path {hub_id_or_folder(args, folder)}"
              f"{f' --environment {environment}' if environment else ''} --splits eval_unseen", "```", "",
              "## Recipe", "", "| Setting | Value |", "|---|---|"]
    settings = recipe_settings(args)
    headline = [name for name in _HEADLINE_SETTINGS if hasattr(args, name)]
    for name in headline + [name for name in settings if name not in headline]:
        lines.append(f"| `{name}` | `{settings.get(name, getattr(args, name, None))}` |")
    metrics = last_metrics(trainer.state.log_history)
    if metrics:
        lines += ["", f"## Results (the last logged step of {trainer.state.global_step})", "", "| Metric | Value |",
                  "|---|---|"] + [f"| `{key}` | {value:.4g} |" for key, value in sorted(metrics.items())]
    versions = package_versions(("taspo-trl", "trl", "transformers", "torch", "peft"))
    lines += ["", "## Framework versions", ""] + [
        f"- {package}: {version or 'not installed'}" for package, version in versions.items()]
    citation = paper.get("citation")
    lines += ["", "## Citations", ""]
    if citation:
        lines += [f"{method}:", "", "```bibtex", citation, "```", ""]
    lines += ["TRL:", "", "```bibtex", _TRL_CITATION, "```", ""]
    return ModelCard("\n".join(lines))


def hub_id_or_folder(args: Any, folder: str) -> str:
    """How a reader refers to the saved model: its Hub repository where the run pushes there, else the folder."""
    return args.hub_model_id if getattr(args, "push_to_hub", False) and args.hub_model_id else os.fspath(folder)


def write_model_card(trainer: Any, folder: str, model_name: str | None = None, dataset_name: str | None = None,
                     tags: list[str] | None = None) -> None:
    """Write the card of ``folder`` (its ``README.md``), on the main process only."""
    if not trainer.is_world_process_zero():
        return
    name = model_name or (trainer.args.hub_model_id or Path(folder).name).split("/")[-1]
    render_model_card(trainer, name, folder, dataset_name, tags).save(os.path.join(folder, "README.md"))


_TRL_CITATION = """@software{vonwerra2020trl,
  title   = {{TRL: Transformers Reinforcement Learning}},
  author  = {von Werra, Leandro and Belkada, Younes and Tunstall, Lewis and Beeching, Edward and Thrush, Tristan and Lambert, Nathan and Huang, Shengyi and Rasul, Kashif and Gallou{\\'e}dec, Quentin},
  license = {Apache-2.0},
  url     = {https://github.com/huggingface/trl},
  year    = {2020}
}"""


class AgentModelCard:
    """Mixed into the agent trainers (before the TRL trainer class): TRL's ``create_model_card`` writes this card,
    and so does every ``save_model`` (a LoRA save would otherwise leave PEFT's blank card)."""

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None,
                          tags: str | list[str] | None = None) -> None:
        write_model_card(self, self.args.output_dir, model_name, dataset_name, [tags] if isinstance(tags, str) else tags)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        super().save_model(output_dir, _internal_call)
        write_model_card(self, output_dir or self.args.output_dir)
