"""The loaders the suite can judge, each behind the seam (`reference.kit.seam`): the reference
(`reference`), diffusers' own loading (`diffusers`), sglang's (`sglang`, where sglang is
installed) and the plain-PyTorch baselines (`baselines`)."""

__all__: list[str] = []
