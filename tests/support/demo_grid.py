"""Read the demo's comparison grid (flowrl.demo.comparison_grid) back: column labels, row labels, and each cell's
image (decoded) and reward caption, row by row."""

import base64
import io
import re

import numpy as np
from PIL import Image


def read_grid(html: str) -> dict:
    cells = re.findall(r'<td><img src="data:image/(\w+);base64,([^"]+)"[^>]*><div class="reward">([^<]*)</div>', html)
    images = []
    for kind, payload, _ in cells:
        data = base64.b64decode(payload)
        images.append(data if kind == "gif" else np.asarray(Image.open(io.BytesIO(data))))
    return {
        "columns": re.findall(r'<th class="model">([^<]*)</th>', html),
        "rows": re.findall(r'<th class="seed">([^<]*)</th>', html),
        "images": images,
        "captions": [caption for _, _, caption in cells],
    }
