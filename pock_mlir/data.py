"""The training data pock-train, pock-search and the federated clients read: an .npz of samples
(x_train, y_train, x_val, y_val; x0_train, x1_train, ... for several inputs; a keyword input by
its name: input_ids_train, attention_mask_train, ...) or a token stream
(tokens_train, tokens_val) cut into next-token windows, checked against a bundle's batch; the
epochs' batch order; and the held-out loss and accuracy of a trainer."""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass

import numpy as np

from pock_mlir.abi import call_inputs
from pock_mlir.runtime import InputError, Trainer
from pock_mlir.runtime.bundle import Bundle
from pock_mlir.runtime.trainer import check_class_indices, check_token_ids

TOKEN_KEYS = ("tokens_train", "tokens_val")
SAMPLE_KEY = re.compile(r"(x\d*|y)_(train|val)")


class DataError(ValueError):
    """The data file cannot be read, or does not fit the bundle."""


@dataclass
class Split:
    """Samples: one array per model input and the target, samples along the first dimension."""

    inputs: list[np.ndarray]
    target: np.ndarray
    tokens_per_sample: int = 0  # the window length when cut from a token stream; 0 for x/y samples
    keywords: tuple[str, ...] = ()  # the names of the last inputs, which the model takes by keyword

    def __len__(self) -> int:
        return len(self.target)

    def batch(self, index: np.ndarray) -> tuple[object, np.ndarray]:
        """(inputs as the Trainer takes them, target) of the samples at `index`."""
        return call_inputs([x[index] for x in self.inputs], self.keywords), self.target[index]


def _input_keys(bundle: Bundle) -> list[str]:
    """The npz names of the model inputs: x (or x0, x1, ...) for positional ones, keyword ones by their names."""
    n = len(bundle.signature.positional_inputs)
    keys = (["x"] if n == 1 else [f"x{i}" for i in range(n)]) + [s.name for s in bundle.signature.keyword_inputs]
    clash = sorted({k for k in keys if keys.count(k) > 1 or k == "y"})
    if clash:
        raise DataError(
            f"the bundle's keyword input(s) {', '.join(clash)} take the npz name(s) of another input or "
            f"of the target (y); wrap the model in a module that takes them under other names"
        )
    return keys


def _fit(
    array: np.ndarray, key: str, spec, problems: list[str], classes: int | None = None, vocabulary: int | None = None
) -> np.ndarray:
    """`array` in the bundle's dtype, or `array` as it is with the mismatch added to `problems`.
    Integer arrays are checked as the Trainer checks a batch: class indices below `classes`, token
    ids below `vocabulary`."""
    want = tuple(spec.shape[1:])
    if array.shape[1:] != want or array.ndim != len(spec.shape):
        problems.append(
            f"{key} has samples of shape {array.shape[1:]}, the bundle takes {want} "
            f"(arrays are (samples, {', '.join(map(str, want))}))".replace(", )", ")")
        )
    if spec.dtype == "int32" and array.dtype in (np.int32, np.int64):
        try:
            check_class_indices(array, classes, key)
            check_token_ids(array, vocabulary, key)
        except InputError as e:
            problems.append(str(e))
        return array.astype(np.int32)
    if str(array.dtype) == spec.dtype:
        return array
    problems.append(
        f"{key} has dtype {array.dtype}, the bundle takes {spec.dtype} (convert with .astype(np.{spec.dtype}))"
    )
    return array


def load_data(path: str, bundle: Bundle, need_train: bool = True) -> tuple[Split | None, Split | None]:
    """The training and (if present) held-out splits, checked against the bundle's batch.
    need_train=False: the training split may be absent (data held out for evaluation only)."""
    try:
        npz = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise DataError(f"cannot read {path}: {e}") from None
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise DataError(
            f"{path} is a single array; pock-train reads an .npz archive (numpy.savez) with x_train, "
            f"y_train, x_val, y_val (or tokens_train, tokens_val)"
        )
    if any(key in npz.files for key in TOKEN_KEYS):
        return load_token_data(npz, path, bundle, need_train)
    sig, keys, batch_size = bundle.signature, _input_keys(bundle), bundle.batch_size
    problems: list[str] = []

    def split(name: str) -> Split | None:
        wanted = [f"{k}_{name}" for k in keys] + [f"y_{name}"]
        present = [k for k in wanted if k in npz.files]
        if not present and (name == "val" or not need_train):
            return None
        if len(present) < len(wanted):
            problems.append(
                f"{path} lacks {', '.join(k for k in wanted if k not in present)} (it holds "
                f"{', '.join(npz.files) or 'nothing'})"
            )
            return None
        try:
            arrays = [npz[k] for k in wanted]
        except (OSError, ValueError, zipfile.BadZipFile) as e:
            problems.append(f"cannot read {name} arrays from {path}: {e}")
            return None
        classes = [None] * len(sig.model_inputs) + [sig.target_classes]
        vocabularies = [sig.vocabularies.get(spec.name) for spec in sig.model_inputs] + [None]
        arrays = [
            _fit(a, k, spec, problems, c, v)
            for a, k, spec, c, v in zip(arrays, wanted, sig.model_inputs + [sig.target], classes, vocabularies)
        ]
        lengths = {k: len(a) for k, a in zip(wanted, arrays)}
        if len(set(lengths.values())) > 1:
            problems.append(f"{' and '.join(f'{k} has {n} samples' for k, n in lengths.items())}; they must match")
        elif arrays[-1].shape[0] < batch_size:
            problems.append(f"{wanted[-1]} has {len(arrays[-1])} samples, fewer than one batch ({batch_size})")
        return Split(list(arrays[:-1]), arrays[-1], keywords=_keywords(sig))

    train, val = split("train"), split("val")
    if problems:
        raise DataError(f"{path} does not fit the bundle {bundle.path}:\n  " + "\n  ".join(problems))
    return train, val


def _keywords(signature) -> tuple[str, ...]:
    return tuple(s.name for s in signature.keyword_inputs)


def _is_integer(spec) -> bool:
    return np.issubdtype(np.dtype(spec.dtype), np.integer)


def next_token_shape(path: str, bundle: Bundle) -> tuple[int, int, int | None]:
    """(batch, seq, vocab) of a next-token model: one (batch, seq) input of token ids, a target of the
    same shape; vocab is None unless the output is (batch, seq, vocab) logits. DataError otherwise."""
    sig, inputs = bundle.signature, bundle.signature.model_inputs
    if (
        len(inputs) == 1
        and len(inputs[0].shape) == 2
        and _is_integer(inputs[0])
        and tuple(sig.target.shape) == tuple(inputs[0].shape)
        and _is_integer(sig.target)
    ):
        batch, seq = inputs[0].shape
        output = tuple(sig.output.shape)
        return batch, seq, output[2] if len(output) == 3 and output[:2] == (batch, seq) else None
    takes = ", ".join(f"{spec.name} {tuple(spec.shape)} {spec.dtype}" for spec in inputs)
    raise DataError(
        f"{path} holds a token stream (tokens_train), which trains next-token models: one input of "
        f"(batch, seq) integer token ids and a target of the same shape. The bundle {bundle.path} is not "
        f"one: it takes {takes} and target {tuple(sig.target.shape)} {sig.target.dtype}. Give it x_train "
        f"and y_train instead (see pock-train --help)"
    )


def token_windows(
    tokens: np.ndarray, seq: int, input_dtype: str, target_dtype: str, keywords: tuple[str, ...]
) -> Split:
    """The stream cut into non-overlapping windows of `seq` tokens, each with the stream one token on
    as its target: window i is tokens[i*seq : (i+1)*seq] -> tokens[i*seq+1 : (i+1)*seq+1]; keywords:
    the input's name when the model takes it by keyword (as Split.keywords)."""
    count = (len(tokens) - 1) // seq
    inputs = tokens[: count * seq].reshape(count, seq).astype(input_dtype)
    target = tokens[1 : count * seq + 1].reshape(count, seq).astype(target_dtype)
    return Split([inputs], target, tokens_per_sample=seq, keywords=keywords)


def load_token_data(npz, path: str, bundle: Bundle, need_train: bool = True) -> tuple[Split | None, Split | None]:
    """The windows of tokens_train and (if present) tokens_val, checked against a next-token bundle."""
    if "tokens_train" not in npz.files and need_train:
        raise DataError(f"{path} holds tokens_val but no tokens_train, the text to train on")
    samples = [key for key in npz.files if SAMPLE_KEY.fullmatch(key)]
    if samples:
        raise DataError(
            f"{path} holds both a token stream (tokens_train) and samples ({', '.join(samples)}); keep one kind of data"
        )
    batch, seq, vocab = next_token_shape(path, bundle)
    (input_spec,), target_spec = bundle.signature.model_inputs, bundle.signature.target
    # Ids outside the vocabulary would index past the embedding table on the device, silently.
    end, what = (vocab, f"the model's vocabulary is 0 to {vocab - 1}") if vocab else (2**31, "the bundle takes int32")
    problems: list[str] = []

    def split(key: str) -> Split | None:
        if key not in npz.files:
            return None
        try:
            tokens = npz[key]
        except (OSError, ValueError, zipfile.BadZipFile) as e:
            problems.append(f"cannot read {key} from {path}: {e}")
            return None
        windows = (len(tokens) - 1) // seq if tokens.ndim == 1 else 0
        if tokens.ndim != 1:
            problems.append(f"{key} has shape {tokens.shape}; a token stream is 1-D (flatten it with .ravel())")
        elif not np.issubdtype(tokens.dtype, np.integer):
            problems.append(f"{key} has dtype {tokens.dtype}; token ids are integers (convert with .astype(np.int32))")
        elif tokens.size and (tokens.min() < 0 or tokens.max() >= end):
            problems.append(f"{key} holds ids from {tokens.min()} to {tokens.max()}; {what}")
        elif windows < 1:
            problems.append(
                f"{key} has {len(tokens)} tokens, shorter than one window: the bundle trains on windows of "
                f"{seq} tokens, each with the token after it as target ({seq + 1} tokens); give a longer "
                f"text or compile the model for shorter sequences"
            )
        elif windows < batch:
            problems.append(
                f"{key} has {len(tokens)} tokens, {windows} window(s) of {seq}: fewer than one batch "
                f"({batch} windows, {batch * seq + 1} tokens)"
            )
        else:
            return token_windows(tokens, seq, input_spec.dtype, target_spec.dtype, _keywords(bundle.signature))
        return None

    train, val = split("tokens_train"), split("tokens_val")
    if problems:
        raise DataError(f"{path} does not fit the bundle {bundle.path}:\n  " + "\n  ".join(problems))
    return train, val


def batch_order(seed: int, epoch: int, samples: int, batch_size: int) -> np.ndarray:
    """(batches, batch_size) sample indices of one epoch; the same for the same (seed, epoch)."""
    order = np.random.default_rng([seed, epoch]).permutation(samples)
    batches = samples // batch_size
    return order[: batches * batch_size].reshape(batches, batch_size)


def evaluate(trainer: Trainer, split: Split, batch_size: int) -> dict[str, float]:
    """Mean loss over the full batches, and accuracy when the output holds class scores for the target."""
    losses, correct, counted = [], 0, 0
    classes = np.issubdtype(split.target.dtype, np.integer) and tuple(trainer.signature.output.shape[:-1]) == tuple(
        trainer.signature.target.shape
    )
    for start in range(0, len(split) - batch_size + 1, batch_size):
        inputs, target = split.batch(np.arange(start, start + batch_size))
        losses.append(trainer.loss(inputs, target))
        if classes:
            correct += int((np.argmax(trainer.evaluate(inputs), axis=-1) == target).sum())
            counted += target.size
    metrics = {"val_loss": float(np.mean(losses))}
    if classes:
        metrics["val_accuracy"] = correct / counted
    return metrics
