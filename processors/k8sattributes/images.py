"""Container image references: `[registry[:port]/]path[:tag][@digest]`."""

from __future__ import annotations

import dataclasses

DEFAULT_TAG = "latest"


@dataclasses.dataclass(frozen=True)
class ImageRef:
    repository: str  # as written in the pod spec, without tag or digest
    written_tag: str
    digest: str

    @property
    def tag(self) -> str:
        """container.image.tag: "latest" when the image names neither a tag nor a digest."""
        return self.written_tag or ("" if self.digest else DEFAULT_TAG)

    @property
    def service_version(self) -> str:
        """service.version by semantic conventions: tag, digest or tag@digest; never assumed."""
        if self.digest:
            return f"{self.written_tag}@{self.digest}" if self.written_tag else self.digest
        return self.written_tag


def parse_image(image: str) -> ImageRef | None:
    name, _, digest = image.partition("@")
    tag = ""
    colon = name.rfind(":")
    if colon > name.rfind("/"):  # a colon before the last slash belongs to a registry port
        name, tag = name[:colon], name[colon + 1 :]
    return ImageRef(name, tag, digest) if name else None
