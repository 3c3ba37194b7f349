"""The error types the stages raise, in one module no stage depends on, so no stage imports another for them."""

from __future__ import annotations

from collections.abc import Mapping


class ModelLoadError(RuntimeError):
    """The checkpoint could not be loaded; the message names the problem and what to do, in one line."""


class CheckpointError(ModelLoadError):
    """`--model` names no checkpoint (no such directory, a file, no model_index.json), or its files cannot be mapped
    onto SDXL's modules: bad input (the app and the CLI exit 2)."""


class InvalidInput(ValueError):
    """Bad user input; str(error) is one sentence fit to show to the user, no traceback needed.

    A sentence that names request fields is made by `naming`, which keeps its template: the APIs and the CLI say
    str(error), the fields by their API names (what their callers type), and the page says `named(labels)`, the
    fields by its controls' labels (what its visitors see: "Upscale by 3 ...", not "hires_scale 3 ...")."""

    def __init__(
        self,
        message: str,
        *,
        template: str = "",
        names: Mapping[str, str] | None = None,
        values: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.template = template  # the sentence with {field} for each field it names ("" = it names none)
        self.names = dict(names or {})  # field -> how the API calls it, for each field the sentence names
        self.values = dict(values or {})  # the template's other placeholders (the user's values, echoed)

    @classmethod
    def naming(cls, template: str, names: Mapping[str, str], /, **values: object) -> InvalidInput:
        """The refusal `template` says, with `{field}` for each field of `names` (field -> its API name) and
        `{key}` for each of `values`. Values are filled in, never read as a template, so user text is safe."""
        return cls(template.format(**values, **names), template=template, names=names, values=values)

    def named(self, labels: Mapping[str, str]) -> str:
        """The sentence with each field it names called as `labels` says (a page's labels by field); a field
        `labels` lacks keeps its API name."""
        if not self.template:
            return str(self)
        return self.template.format(
            **self.values, **{field: labels.get(field, name) for field, name in self.names.items()}
        )


class EngineUnavailable(RuntimeError):
    """No engine could run the request: the one running it stopped mid-request and none other could, or none was ready
    in time (a page in front of engine services). str(error) is one sentence fit to show to the user. Engines that die
    or restart are expected, not a bug: the page says the sentence and logs the traceback at DEBUG only."""
