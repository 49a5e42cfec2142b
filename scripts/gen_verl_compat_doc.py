"""Write docs/verl_compat.md from the schema and verl's key rules (verl.config.compat_doc.render)."""

from pathlib import Path

from verl.config.compat_doc import render

OUT = Path(__file__).resolve().parent.parent / "docs" / "verl_compat.md"

if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")
