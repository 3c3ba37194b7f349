// Run once when the page loads (Gradio adds it to the page as a <script>).
(() => {
  // A number typed into a slider's box outside its range is set to the nearest limit by Gradio when the box loses
  // focus, silently. Say it under the slider instead: "1000 is more than 100: set to 100." An emptied box Gradio
  // sets to the lowest value (Math.max(null, 1): 1 step, guidance 0), also silently: it goes back to the slider's
  // default instead (Gradio's own reset button, what the API does with a field left out) and says so.
  const note = (input, text) => {
    const block = input.closest(".block");
    if (!block) return;
    let line = block.querySelector(".range-note");
    if (!line) {
      line = document.createElement("div");
      line.className = "range-note";
      line.setAttribute("role", "status");
      block.appendChild(line);
    }
    line.textContent = text;
  };
  const check = (event) => {
    const input = event.target;
    const sliders = ".bounded";  // the request fields' sliders (web/page/form.py: control)
    if (!(input instanceof HTMLInputElement) || input.type !== "number" || !input.closest(sliders)) return;
    const value = Number(input.value);
    const min = Number(input.min), max = Number(input.max);
    const reset = input.closest(".block")?.querySelector("[data-testid=reset-button]");
    if (input.value === "" && reset) {
      reset.click();
      const shown = input.closest(".block").querySelector("input[type=range]");
      return requestAnimationFrame(() => note(input, `Left empty: set back to the default, ${shown.value}.`));
    }
    if (input.value === "" || Number.isNaN(value)) return note(input, "");
    if (value > max) return note(input, `${input.value} is more than ${max}: set to ${max}.`);
    if (value < min) return note(input, `${input.value} is less than ${min}: set to ${min}.`);
    note(input, "");
  };
  // Capture phase of blur: runs before Gradio's own blur handler on the box, which replaces the typed value (and
  // flushes it to the box, so focusout, which fires after blur, already saw the replaced value).
  document.addEventListener("blur", check, true);
  document.addEventListener("keydown", (event) => event.key === "Enter" && check(event), true);

  // PNG Info: an image dropped anywhere on the page, outside the inputs that take a picture, goes to the "Use an
  // image's settings" button, whose upload fills the form from the image's parameters.
  const pictureInputs = "#init-image, #mask-editor, #settings-image, input[type=file]";
  const carriesFile = (event) => [...(event.dataTransfer?.types || [])].includes("Files");
  document.addEventListener("dragover", (event) => {
    if (carriesFile(event) && !event.target.closest?.(pictureInputs)) event.preventDefault();
  });
  document.addEventListener("drop", (event) => {
    if (!carriesFile(event) || event.target.closest?.(pictureInputs)) return;
    // Gradio puts an upload button's file input beside the button (in the same row), not inside it.
    const input = document.querySelector("#settings-image")?.parentElement?.querySelector("input[type=file]");
    const file = event.dataTransfer.files[0];
    if (!input || !file) return;
    event.preventDefault();
    const files = new DataTransfer();
    files.items.add(file);
    input.files = files.files;
    input.dispatchEvent(new Event("change", { bubbles: true }));
  });

  // Start from a picture: as an event's input, the mask editor exports and uploads its picture, strokes and
  // composite (three PNGs at the picture's size: seconds in a browser without a GPU); only strokes make a mask.
  // Until something is painted on the editor, Generate and Enter run the event without it; once painted, they press
  // the hidden #generate-painted, whose event takes it (web/page/layout.py: wire_generate). Strokes count for the
  // picture they were painted on: the chip beside Generate shows the picture in use, and a new one (uploaded, "Use as
  // picture") or none (its ✕) gives the editor a fresh picture without strokes. Vary leaves the editor alone.
  const inUse = () => document.querySelector("#picture-chip-image img")?.getAttribute("src") || "";
  let paintedOn = null;  // the chip's picture when a stroke was painted; null: nothing painted
  document.addEventListener("pointerdown", (event) => {
    if (event.target.closest?.("#mask-editor canvas")) paintedOn = inUse();
  }, true);
  document.addEventListener("change", (event) => {
    if (event.target.closest?.("#init-image")) paintedOn = null;
  }, true);
  const runPainted = (event) => {
    const button = document.querySelector("#generate-painted");
    if (paintedOn === null || paintedOn !== inUse() || !button) return;
    event.preventDefault();
    event.stopPropagation();  // in the capture phase: Gradio's own handler never sees it
    button.click();
  };
  document.addEventListener("click", (event) => {
    if (event.target.closest?.("#generate")) runPainted(event);
  }, true);
  // Gradio's textbox submits on "keypress" Enter (a one-line box; Shift+Enter is a new line).
  document.addEventListener("keypress", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing && event.target.closest?.("#prompt")) {
      runPainted(event);
    }
  }, true);
})();
