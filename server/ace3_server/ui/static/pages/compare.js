// Placeholder until this page is built.
import { el } from "../util.js";

export async function render(root) {
  root.append(el("h1", {}, "compare"));
}
