"""The script's saving after ``fit``, on every rank, with no rank guard.

Every rank runs the script's ``model.save("model.keras")`` (and ``save_weights``, ``export``)
on the same path: on a shared filesystem the ranks would write one file at once and another
rank's ``load_model`` could read half of it. After a data-parallel ``fit`` the model's saving
methods write to a temporary name beside the target (Keras' own writer, the same extension) and
rename it into place: every rank holds the same weights, so whichever rename lands last leaves
the same whole file, and a reader sees a whole file or none. Without a shared filesystem each
node gets its own whole copy. Models inside the fitted one (a GAN's generator, a transfer-learning
base) get the same methods. Remote paths (``gs://``...) are Keras' own business, untouched.
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

SUFFIXES = (".weights.h5", ".weights.json", ".keras", ".h5", ".hdf5")
SAVING_METHODS = ("save", "save_weights", "export")


def _temporary(path: Path) -> Path:
    name = path.name
    suffix = next((s for s in SUFFIXES if name.endswith(s)), "")
    stem = name[:len(name) - len(suffix)] if suffix else name
    return path.with_name(f".{stem}.{os.getpid()}-{secrets.token_hex(3)}.partial{suffix}")


def _put_in_place(tmp: Path, path: Path) -> None:
    if tmp.is_dir():  # an exported SavedModel: the first whole directory stays; later ones are equal
        try:
            os.rename(tmp, path)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    os.replace(tmp, path)


def whole_file_saving(method: Any) -> Any:
    """``method(filepath, ...)`` that writes ``filepath`` by a rename, so it is never seen half-written."""

    @functools.wraps(method)
    def save(filepath: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(filepath, (str, os.PathLike)) or "://" in str(filepath):
            return method(filepath, *args, **kwargs)
        path = Path(filepath)
        tmp = _temporary(path)
        try:
            result = method(str(tmp), *args, **kwargs)
            _put_in_place(tmp, path)
        except BaseException:
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            elif tmp.exists():
                tmp.unlink()
            raise
        return result

    save.whole_file = True  # type: ignore[attr-defined]
    return save


def save_whole_files(model: Any) -> None:
    """Give ``model`` and every model inside it (a GAN's generator, a transfer-learning base), this
    process's objects only, saving methods that write by rename."""
    import keras

    inner = [layer for layer in model._flatten_layers(include_self=False) if isinstance(layer, keras.Model)]
    inner += [value for _, value in sorted(vars(model).items()) if isinstance(value, keras.Model)]
    for each in [model, *inner]:
        for name in SAVING_METHODS:
            method = getattr(each, name, None)
            if method is not None and not getattr(method, "whole_file", False):
                object.__setattr__(each, name, whole_file_saving(method))
