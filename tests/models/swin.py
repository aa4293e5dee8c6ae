"""A small Swin Transformer (Liu et al. 2021), written as the reference code writes it: window attention
through view/permute, shifted windows through torch.roll with an attention mask, a learned relative
position bias gathered by index, patch merging by strided slicing, LayerNorm and a GELU MLP."""

from __future__ import annotations

import torch
from torch import nn


def window_partition(x: torch.Tensor, ws: int) -> torch.Tensor:
    b, h, w, c = x.shape
    x = x.view(b, h // ws, ws, w // ws, ws, c)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, ws * ws, c)


def window_reverse(windows: torch.Tensor, ws: int, h: int, w: int) -> torch.Tensor:
    b = windows.shape[0] // (h * w // ws // ws)
    x = windows.view(b, h // ws, w // ws, ws, ws, -1)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(b, h, w, -1)


def _relative_index(ws: int) -> torch.Tensor:
    coords = torch.stack(torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (ws - 1)
    return rel[..., 0] * (2 * ws - 1) + rel[..., 1]


def _shift_mask(res: int, ws: int, shift: int) -> torch.Tensor:
    img = torch.zeros(1, res, res, 1)
    cuts = (slice(0, -ws), slice(-ws, -shift), slice(-shift, None))
    for n, (hs, wsl) in enumerate((hs, wsl) for hs in cuts for wsl in cuts):
        img[:, hs, wsl, :] = n
    win = window_partition(img, ws).squeeze(-1)
    diff = win[:, None, :] - win[:, :, None]
    return diff.masked_fill(diff != 0, -100.0).masked_fill(diff == 0, 0.0)


class WindowAttention(nn.Module):
    def __init__(self, dim: int, ws: int, heads: int) -> None:
        super().__init__()
        self.ws, self.heads, self.scale = ws, heads, (dim // heads) ** -0.5
        self.bias_table = nn.Parameter(torch.randn((2 * ws - 1) ** 2, heads) * 0.02)
        self.register_buffer("rel_index", _relative_index(ws), persistent=False)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        bw, n, c = x.shape
        q, k, v = self.qkv(x).reshape(bw, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        bias = self.bias_table[self.rel_index.view(-1)].view(n, n, -1).permute(2, 0, 1).contiguous()
        attn = attn + bias.unsqueeze(0)
        if mask is not None:
            nw = mask.shape[0]
            attn = attn.view(bw // nw, nw, self.heads, n, n) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.heads, n, n)
        y = (attn.softmax(dim=-1) @ v).transpose(1, 2).reshape(bw, n, c)
        return self.proj(y)


class SwinBlock(nn.Module):
    def __init__(self, dim: int, res: int, heads: int, ws: int, shift: int, dropout: float) -> None:
        super().__init__()
        self.res, self.ws, self.shift = res, ws, shift
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, ws, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(4 * dim, dim))
        self.register_buffer("mask", _shift_mask(res, ws, shift) if shift else None, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, c = x.shape
        h = self.norm1(x).view(b, self.res, self.res, c)
        if self.shift:
            h = torch.roll(h, shifts=(-self.shift, -self.shift), dims=(1, 2))
        h = self.attn(window_partition(h, self.ws), self.mask)
        h = window_reverse(h.view(-1, self.ws, self.ws, c), self.ws, self.res, self.res)
        if self.shift:
            h = torch.roll(h, shifts=(self.shift, self.shift), dims=(1, 2))
        x = x + h.reshape(b, length, c)
        return x + self.mlp(self.norm2(x))


class PatchMerging(nn.Module):
    def __init__(self, res: int, dim: int) -> None:
        super().__init__()
        self.res = res
        self.norm, self.reduction = nn.LayerNorm(4 * dim), nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, c = x.shape
        x = x.view(b, self.res, self.res, c)
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
        return self.reduction(self.norm(x.view(b, -1, 4 * c)))


class Swin(nn.Module):
    """Two stages, on a 16x16 image: patch 2 -> 8x8 tokens in windows of 4 (a block per entry of
    `shifts`: 0 plain, ws // 2 shifted), patch merging -> 4x4 tokens (one window), final
    LayerNorm, mean pool, linear head."""

    def __init__(
        self, dim: int = 32, ws: int = 4, image: int = 16, shifts: tuple[int, ...] = (0, 2), dropout: float = 0.0
    ) -> None:
        super().__init__()
        res = image // 2
        self.embed, self.embed_norm = nn.Conv2d(3, dim, 2, 2), nn.LayerNorm(dim)
        self.stage1 = nn.Sequential(*(SwinBlock(dim, res, 2, ws, shift, dropout) for shift in shifts))
        self.merge = PatchMerging(res, dim)
        self.stage2 = SwinBlock(2 * dim, res // 2, 4, ws, 0, dropout)
        self.norm, self.head = nn.LayerNorm(2 * dim), nn.Linear(2 * dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed_norm(self.embed(x).flatten(2).transpose(1, 2))
        x = self.stage2(self.merge(self.stage1(x)))
        return self.head(self.norm(x).mean(1))
