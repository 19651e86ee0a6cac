"""Reading safetensors checkpoints, single-file or sharded, one region at a time.

A checkpoint is a directory holding `model.safetensors` or `model.safetensors.index.json`
(its `weight_map` names the shard of every tensor) and usually `config.json`, or the path of
one `.safetensors` file (or of the index). Everything in it is untrusted: the JSON files are
size-limited and checked for shape, shard names must be plain file names inside the
directory, and every failure is a CheckpointError naming the file.

Tensors are read with safetensors' `safe_open(...).get_slice(key)[index]`, which copies only
the requested region out of the memory-mapped file. bfloat16 reads as numpy through ml_dtypes
(a JAX dependency), which registers the dtype numpy's safetensors reader looks up.
"""

from __future__ import annotations

import json
import os
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
MAX_JSON_BYTES = 64 << 20  # DeepSeek-V3's index (92k tensors, FP8 scales included) is 9 MB
MAX_CONFIG_BYTES = 4 << 20
FLOAT_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded into the module, and why (with the fix)."""


def _safetensors() -> Any:
    try:
        import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy for safetensors)
        import safetensors
    except ImportError as error:
        raise CheckpointError(
            f"reading checkpoints needs safetensors ({error}): "
            "pip install 'moegen[checkpoints]' (or pip install safetensors)"
        ) from None
    return safetensors


def _read_json(path: Path, limit: int, what: str) -> Any:
    try:
        size = path.stat().st_size
        if size > limit:
            raise CheckpointError(f"{path}: {what} of {size} bytes is over the {limit}-byte limit")
        text = path.read_bytes().decode("utf-8")
        return json.loads(text)
    except CheckpointError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        raise CheckpointError(f"{path}: cannot read {what}: {error}") from None


class Checkpoint:
    """The tensors of a checkpoint (names, shards, shapes, dtypes) and region reads."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        if not isinstance(path, str | os.PathLike):
            raise CheckpointError(
                f"the checkpoint path must be a str or a path, got {type(path).__name__}"
            )
        try:
            root = Path(path)
            is_dir, is_file = root.is_dir(), root.is_file()
        except (OSError, ValueError) as error:
            raise CheckpointError(f"{path!r}: not a usable path: {error}") from None
        self._stack = ExitStack()
        self._handles: dict[Path, Any] = {}
        self.config_path: Path | None = None
        try:
            self._locate(root, is_dir, is_file)
        except BaseException:
            self.close()
            raise

    def _locate(self, root: Path, is_dir: bool, is_file: bool) -> None:
        if is_dir:
            self.directory = root
            index, single = root / INDEX_NAME, root / SINGLE_NAME
            if index.is_file():
                self._from_index(index)
            elif single.is_file():
                self._from_single(single)
            else:
                raise CheckpointError(
                    f"{root}: neither {INDEX_NAME} nor {SINGLE_NAME} is in this directory; pass "
                    "the directory save_pretrained wrote, or the path of one .safetensors file"
                )
        elif is_file:
            self.directory = root.parent
            if root.name.endswith(".index.json"):
                self._from_index(root)
            elif root.name.endswith(".safetensors"):
                self._from_single(root)
            else:
                raise CheckpointError(f"{root}: not a .safetensors file or a safetensors index")
        else:
            raise CheckpointError(f"{root}: no such file or directory")
        config = self.directory / CONFIG_NAME
        self.config: dict[str, Any] | None = None
        if config.is_file():
            loaded = _read_json(config, MAX_CONFIG_BYTES, "the config")
            if not isinstance(loaded, dict):
                raise CheckpointError(f"{config}: the config must be a JSON object")
            self.config, self.config_path = loaded, config

    # -- the tensor names --------------------------------------------------------------

    def _from_index(self, index: Path) -> None:
        data = _read_json(index, MAX_JSON_BYTES, "the safetensors index")
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: no weight_map object (tensor name -> shard file)")
        self.description = str(index)
        shards: dict[str, Path] = {}
        self.files: dict[str, Path] = {}
        for key, name in weight_map.items():
            if not isinstance(name, str):
                raise CheckpointError(f"{index}: weight_map[{key!r}] is not a file name")
            if name not in shards:
                shards[name] = self._shard(index, name)
            self.files[key] = shards[name]

    def _shard(self, index: Path, name: str) -> Path:
        plain = Path(name)
        if (
            not name
            or plain.is_absolute()
            or len(plain.parts) != 1
            or name in (".", "..")
            or not name.endswith(".safetensors")
            or any(ord(c) < 32 for c in name)
        ):
            raise CheckpointError(
                f"{index}: shard {name!r} is not a plain .safetensors file name in "
                f"{self.directory}; shards must sit beside the index"
            )
        return index.parent / name

    def _from_single(self, path: Path) -> None:
        self.description = str(path)
        handle = self._open(path)
        self.files = dict.fromkeys(handle.keys(), path)

    # -- reading -----------------------------------------------------------------------

    def _open(self, path: Path) -> Any:
        handle = self._handles.get(path)
        if handle is None:
            safetensors = _safetensors()
            try:
                handle = self._stack.enter_context(
                    safetensors.safe_open(str(path), framework="numpy")
                )
            except FileNotFoundError:
                raise CheckpointError(
                    f"{path}: the shard is missing (named by the checkpoint's index)"
                ) from None
            except Exception as error:  # SafetensorError, OSError: a corrupt or unreadable file
                raise CheckpointError(f"{path}: not a readable safetensors file: {error}") from None
            self._handles[path] = handle
        return handle

    def _slice(self, key: str) -> Any:
        path = self.files[key]
        try:
            return self._open(path).get_slice(key)
        except CheckpointError:
            raise
        except Exception as error:
            raise CheckpointError(
                f"{path}: tensor {key!r} (named by the index) cannot be read from it: {error}"
            ) from None

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(int(n) for n in self._slice(key).get_shape())

    def dtype(self, key: str) -> str:
        """safetensors' dtype name: F32, BF16, F8_E4M3, U8, ..."""
        return str(self._slice(key).get_dtype())

    def read(self, key: str, index: tuple[slice, ...]) -> np.ndarray:
        """The region `index` of tensor `key`, and nothing else of it."""
        try:
            return np.asarray(self._slice(key)[index])
        except CheckpointError:
            raise
        except Exception as error:
            raise CheckpointError(f"{self.files[key]}: reading {key!r} failed: {error}") from None

    def close(self) -> None:
        self._handles.clear()
        self._stack.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
