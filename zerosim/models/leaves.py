"""ZeRO-3 leaf modules (pure; no SimPy): which parts of the model DeepSpeed fetches whole.

ZeRO-3 hooks every module of the model, recursing into its children, but stops at a module
flagged a leaf (parameter_offload.py `_register_deepspeed_module`): that module's hooks fetch
every parameter under it at once, no module inside it fires a hook, and one hook reduces all
their gradients when its backward ends (stage3.py `create_reduce_and_remove_grad_hooks`,
`reduce_leaf_module_grads`). Three things flag leaves, and the outermost flagged module on each
path is the one that counts:

- the training script (`deepspeed.utils.set_z3_leaf_modules`; a stack's `modules.moe_block:
  leaf` flags each mixture-of-experts block),
- `zero_optimization.leaf_module` (DeepSpeed 0.18.0+): module classes, full names and name
  suffixes; its default classes are transformers' Mixtral, Qwen2-MoE and Qwen3-MoE blocks,
- `zero_optimization.module_granularity_threshold` (0.16.0+): each module's granularity is
  the parameters under it over the modules with parameters under it, itself included
  (containers such as `nn.ModuleList` pass their children's counts on; a module without
  children, or one above `Z3_MAX_LEAF_SIZE` parameters, is never fine-grained), and the
  first module at or below the threshold on each path from the top becomes a leaf.

zerosim's modules are the model's fetch units and parameter-less ops in forward order
(`breakdown.Module`), named by their path in a transformers Llama-style model
(`layers.3.self_attn.q_proj`). `module_tree` rebuilds the model's module tree from those
paths, inside the top-level modules the stack's framework wraps them in (`MODULE_TREES`), and
names each node as `named_modules()` would and by its class where the framework's classes are
known (`HF_CLASSES`, `MEGATRON_CLASSES`). A leaf's modules are contiguous in forward order;
`hold_in_first` gives the first of them every parameter of the leaf (`Module.keeps_gathered_for`
says how long they stay gathered).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from zerosim.models.breakdown import Module, shapes_of, vector_flags

Z3_MAX_LEAF_SIZE = 1_000_000_000
"""parameter_offload.py `_get_granularity_recursively`: a module holding more parameters is
never made a leaf by the threshold ("an oversized leaf module increases the number of live
parameters")."""
COARSE = sys.maxsize
"""The granularity DeepSpeed gives a module the threshold never makes a leaf."""

ModuleTreeKind = Literal["transformers", "megatron"]
MODULE_TREES: tuple[ModuleTreeKind, ...] = ("transformers", "megatron")
"""How a framework wraps the layers: transformers' `XForCausalLM` holds `model` (the
embeddings, the `layers` list and the final norm) and `lm_head`; Megatron-DeepSpeed's
`GPTModel` holds `language_model`, which holds `embedding` (word and position embeddings),
`encoder` (the `layers` list and the final norm) and `output_layer`."""

ROOT, BODY, LAYER, ATTENTION, MLP, MOE_BLOCK = (
    "root", "body", "layer", "attention", "mlp", "moe_block")
LANGUAGE_MODEL, EMBEDDING, ENCODER = "language_model", "embedding", "encoder"


@dataclass(frozen=True)
class HfClasses:
    """The module classes of one transformers `model_type`: their module path and the prefix
    of their names (`LlamaDecoderLayer`), the top model's and the mixture-of-experts block's
    own names where they do not follow it ("" for a model without such a block)."""

    module: str
    prefix: str
    moe_block: str = ""
    body: str = ""


HF_CLASSES: dict[str, HfClasses] = {
    "llama": HfClasses("llama", "Llama"),
    "mistral": HfClasses("mistral", "Mistral"),
    "qwen2": HfClasses("qwen2", "Qwen2"),
    "qwen3": HfClasses("qwen3", "Qwen3"),
    "gemma": HfClasses("gemma", "Gemma"),
    "gemma2": HfClasses("gemma2", "Gemma2"),
    "gemma3_text": HfClasses("gemma3", "Gemma3", body="Gemma3TextModel"),
    "phi3": HfClasses("phi3", "Phi3"),
    "olmo2": HfClasses("olmo2", "Olmo2"),
    "olmo3": HfClasses("olmo3", "Olmo3"),
    "mixtral": HfClasses("mixtral", "Mixtral", moe_block="MixtralSparseMoeBlock"),
    "qwen2_moe": HfClasses("qwen2_moe", "Qwen2Moe", moe_block="Qwen2MoeSparseMoeBlock"),
    "qwen3_moe": HfClasses("qwen3_moe", "Qwen3Moe", moe_block="Qwen3MoeSparseMoeBlock"),
}
"""transformers' classes for the Llama-style model types whose modules are named by the
pattern (`{prefix}ForCausalLM`, `{prefix}Model`, `{prefix}DecoderLayer`, `{prefix}Attention`,
`{prefix}MLP`), read in transformers 5.x `models/<module>/modeling_<module>.py`; a class of
another model type matches no module zerosim builds (`find_leaves` says so)."""

MEGATRON_CLASSES: dict[str, str] = {
    ROOT: "megatron.model.gpt_model.GPTModel",
    LANGUAGE_MODEL: "megatron.model.language_model.TransformerLanguageModel",
    EMBEDDING: "megatron.model.language_model.Embedding",
    ENCODER: "megatron.model.transformer.ParallelTransformer",
    LAYER: "megatron.model.transformer.ParallelTransformerLayer",
    ATTENTION: "megatron.model.transformer.ParallelAttention",
    MLP: "megatron.model.transformer.ParallelMLP",
    MOE_BLOCK: "deepspeed.moe.layer.MoE",
}
"""Megatron-DeepSpeed's classes (megatron/model/*.py), fully qualified."""

_MEGATRON_NAMES = {"embed_tokens": "word_embeddings", "embed_positions": "position_embeddings",
                   "norm": "final_layernorm", "lm_head": "output_layer",
                   "self_attn": "self_attention", "q_proj": "query", "kv_proj": "key_value",
                   "qkv_proj": "query_key_value", "o_proj": "dense",
                   "gate_up_proj": "dense_h_to_4h", "down_proj": "dense_4h_to_h"}
"""Megatron-DeepSpeed's attribute names for the parts zerosim names as transformers does."""


@dataclass
class TreeNode:
    """One module of the model: its name in `named_modules()`, its role (for its class), the
    parameters it holds itself, whether it is a container (`nn.ModuleList`), its children by
    attribute, and the indices of the zerosim modules at or under it."""

    name: str
    role: str = ""
    own: int = 0
    container: bool = False
    children: dict[str, TreeNode] = field(default_factory=dict)
    indices: list[int] = field(default_factory=list)

    def child(self, key: str, name: str, role: str = "") -> TreeNode:
        node = self.children.get(key)
        if node is None:
            node = self.children[key] = TreeNode(name, role)
        return node

    @property
    def total(self) -> int:
        return self.own + sum(child.total for child in self.children.values())

    @property
    def span(self) -> tuple[int, int]:
        return min(self.indices), max(self.indices)

    def walk(self) -> Iterator[TreeNode]:
        yield self
        for child in self.children.values():
            yield from child.walk()


def _joined(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _top(root: TreeNode, first: str, kind: ModuleTreeKind) -> list[TreeNode]:
    """The wrappers a zerosim path starting with `first` hangs from, outermost first."""
    if first == "loss" or (kind == "transformers" and first == "lm_head"):
        return [root]
    if kind == "transformers":
        return [root, root.child("model", "model", BODY)]
    language = root.child("language_model", "language_model", LANGUAGE_MODEL)
    if first.startswith("embed"):
        return [root, language,
                language.child("embedding", "language_model.embedding", EMBEDDING)]
    if first in ("layers", "norm"):
        return [root, language,
                language.child("encoder", "language_model.encoder", ENCODER)]
    return [root, language]


def module_tree(modules: Sequence[Module], kind: ModuleTreeKind) -> TreeNode:
    """The model's module tree, rebuilt from zerosim's module paths (see the module doc)."""
    root = TreeNode("", ROOT)
    rename = _MEGATRON_NAMES if kind == "megatron" else {}
    for index, module in enumerate(modules):
        parts = module.name.split(".")
        chain = _top(root, parts[0], kind)
        for wrapper in chain:
            wrapper.indices.append(index)
        node = chain[-1]
        name = node.name
        for part in parts:
            if part.isdigit():
                node.container = True
            name = _joined(name, rename.get(part, part))
            node = node.child(part, name)
            node.indices.append(index)
        node.own += module.params
    _give_roles(root)
    return root


def _give_roles(root: TreeNode) -> None:
    """The roles the framework's classes follow: each decoder layer, its attention, its MLP
    or mixture-of-experts block, and each MLP inside such a block (the shared expert, each
    expert of a list)."""
    for node in root.walk():
        layers = node.children.get("layers")
        if layers is None or not layers.container:
            continue
        for layer in layers.children.values():
            layer.role = LAYER
            for key in ("self_attn", "attn"):
                if key in layer.children and layer.children[key].total:
                    layer.children[key].role = ATTENTION
            mlp = layer.children.get("mlp")
            if mlp is None or not mlp.children:
                continue
            mlp.role = MOE_BLOCK if "experts" in mlp.children else MLP
            if mlp.role != MOE_BLOCK:
                continue
            shared = mlp.children.get("shared_expert")
            if shared is not None:
                shared.role = MLP
            experts = mlp.children["experts"]
            if experts.container:
                for expert in experts.children.values():
                    expert.role = MLP


def granularity(node: TreeNode) -> dict[int, int]:
    """Each node's granularity (by `id`), as `_get_granularity_recursively` computes it (the
    nodes under one without parameters are not visited: `COARSE`)."""
    found: dict[int, int] = {}

    def visit(n: TreeNode) -> tuple[int, int]:
        if n.total == 0:
            found[id(n)] = COARSE
            return 0, 0
        if not n.children:
            found[id(n)] = COARSE
            return 1, n.own
        layers, params = 0, n.own
        for child in n.children.values():
            child_layers, child_params = visit(child)
            layers += child_layers
            params += child_params
        if n.container:
            found[id(n)] = COARSE
            return layers, params
        layers += 1
        found[id(n)] = params // layers if params <= Z3_MAX_LEAF_SIZE else COARSE
        return layers, params

    visit(node)
    return found


def _by_threshold(root: TreeNode, threshold: int, grain: dict[int, int]) -> list[TreeNode]:
    """`_set_leaf_by_threshold_preorder`: the first node at or below the threshold on each
    path from the top."""
    found: list[TreeNode] = []

    def visit(n: TreeNode) -> None:
        if n.total == 0:
            return
        if grain.get(id(n), COARSE) <= threshold:
            found.append(n)
            return
        for child in n.children.values():
            visit(child)

    visit(root)
    return found


def class_names(node: TreeNode, kind: ModuleTreeKind, model_type: str) -> tuple[str, ...]:
    """The names `set_z3_leaf_modules` matches a node's class by (its `__name__` and its
    module-qualified name), where zerosim knows them."""
    if kind == "megatron":
        qualified = MEGATRON_CLASSES.get(node.role, "")
        return (qualified.rsplit(".", 1)[-1], qualified) if qualified else ()
    classes = HF_CLASSES.get(model_type)
    if classes is None or not node.role:
        return ()
    p = classes.prefix
    name = {ROOT: f"{p}ForCausalLM", BODY: classes.body or f"{p}Model",
            LAYER: f"{p}DecoderLayer", ATTENTION: f"{p}Attention", MLP: f"{p}MLP",
            MOE_BLOCK: classes.moe_block}.get(node.role, "")
    if not name:
        return ()
    return name, f"transformers.models.{classes.module}.modeling_{classes.module}.{name}"


@dataclass(frozen=True)
class LeafRules:
    """What flags leaves (see the module doc); `kind` and `model_type` say which classes the
    model's modules are."""

    kind: ModuleTreeKind = "transformers"
    model_type: str = ""
    moe_blocks: bool = False
    granularity_threshold: int = 0
    classes: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    name_suffixes: tuple[str, ...] = ()

    @property
    def any(self) -> bool:
        return bool(self.moe_blocks or self.granularity_threshold or self.classes
                    or self.names or self.name_suffixes)


@dataclass(frozen=True)
class Leaves:
    """The leaves found, each as (first, last) module index and its name; the classes, names
    and name suffixes of the rules that match no module; the finest module and its
    granularity when the threshold makes no leaf."""

    spans: tuple[tuple[int, int], ...] = ()
    names: tuple[str, ...] = ()
    unmatched_classes: tuple[str, ...] = ()
    unmatched_names: tuple[str, ...] = ()
    unmatched_suffixes: tuple[str, ...] = ()
    finest: tuple[str, int] | None = None


def find_leaves(modules: Sequence[Module], rules: LeafRules) -> Leaves:
    """The outermost flagged modules with parameters (see the module doc)."""
    if not rules.any:
        return Leaves()
    root = module_tree(modules, rules.kind)
    nodes = list(root.walk())
    flagged: set[int] = set()
    if rules.moe_blocks:
        flagged.update(id(n) for n in nodes if n.role == MOE_BLOCK)
    classes = {n_id: class_names(n, rules.kind, rules.model_type)
               for n_id, n in ((id(n), n) for n in nodes)}
    flagged.update(n_id for n_id, names in classes.items() if set(rules.classes) & set(names))
    known = {name for names in classes.values() for name in names}
    named = {n.name: n for n in nodes}
    flagged.update(id(named[name]) for name in rules.names if name in named)
    suffixed = [n for n in nodes if any(n.name.endswith(s) for s in rules.name_suffixes)]
    flagged.update(id(n) for n in suffixed)
    finest = None
    if rules.granularity_threshold:
        grain = granularity(root)
        by_threshold = _by_threshold(root, rules.granularity_threshold, grain)
        flagged.update(id(n) for n in by_threshold)
        if not by_threshold:
            fine = min(nodes, key=lambda n: grain.get(id(n), COARSE))
            finest = (fine.name, grain.get(id(fine), COARSE))
    leaves = _outermost(root, flagged)
    return Leaves(
        spans=tuple(n.span for n in leaves), names=tuple(n.name for n in leaves),
        unmatched_classes=tuple(c for c in rules.classes if c not in known),
        unmatched_names=tuple(name for name in rules.names if name not in named),
        unmatched_suffixes=tuple(s for s in rules.name_suffixes
                                 if not any(n.name.endswith(s) for n in nodes)),
        finest=finest)


def _outermost(root: TreeNode, flagged: set[int]) -> list[TreeNode]:
    """`_register_deepspeed_module`: the first flagged node on each path, if it holds any
    parameter, in forward order."""
    found: list[TreeNode] = []

    def visit(n: TreeNode) -> None:
        if id(n) in flagged:
            if n.total > 0:
                found.append(n)
            return
        for child in n.children.values():
            visit(child)

    visit(root)
    return sorted(found, key=lambda n: n.span)


def hold_in_first(modules: Sequence[Module], spans: Sequence[tuple[int, int]]
                  ) -> tuple[Module, ...]:
    """Each leaf's parameters held by its first module, so one hook gathers them all; they
    stay gathered until the leaf's last module has run (`keeps_gathered_for`), and their
    gradients come when its backward, the leaf's last, ends. The others hold none, so no hook
    of theirs fetches; none is an external parameter any more (the leaf's hook fetches what
    is under it)."""
    out = list(modules)
    for first, last in spans:
        block = out[first:last + 1]
        numels = tuple(n for m in block for n in m.param_numels)
        vectors = tuple(flag for m in block for flag in vector_flags(m))
        shapes = tuple(shape for m in block for shape in shapes_of(m))
        out[first] = replace(block[0], params=sum(numels), param_numels=numels,
                             one_dimensional=vectors, param_shapes=shapes,
                             keeps_gathered_for=last - first, external=False)
        for index in range(first + 1, last + 1):
            out[index] = replace(out[index], params=0, param_numels=(), one_dimensional=(),
                                 param_shapes=(), external=False)
    return tuple(out)


def leaf_thresholds(modules: Sequence[Module], rules: LeafRules) -> tuple[int, ...]:
    """The granularity thresholds that give `modules` distinct sets of leaves besides none
    (with what else `rules` flags), each the smallest that gives its set: what a search over
    `module_granularity_threshold` needs to try."""
    grain = granularity(module_tree(modules, rules.kind))
    found: list[int] = []
    seen = {find_leaves(modules, replace(rules, granularity_threshold=0)).spans}
    for threshold in sorted(set(grain.values()) - {COARSE}):
        spans = find_leaves(modules, replace(rules, granularity_threshold=threshold)).spans
        if spans not in seen:
            seen.add(spans)
            found.append(threshold)
    return tuple(found)
