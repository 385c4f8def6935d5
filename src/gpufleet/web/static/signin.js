// The sign-in form: the token goes once to POST /api/v1/session, which answers with an
// HTTP-only cookie; this page keeps no copy of it (the field is cleared either way).
"use strict";

(() => {
  const form = document.getElementById("signin");
  const field = document.getElementById("token");
  const error = document.getElementById("signin-error");

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const token = field.value.trim();
    field.value = "";
    error.hidden = true;
    let r;
    try {
      r = await fetch("/api/v1/session", {
        method: "POST", credentials: "same-origin",
        headers: { "Content-Type": "application/json", Accept: "application/json" },
        body: JSON.stringify({ token }),
      });
    } catch (e) {
      r = null;
    }
    if (r && r.ok) {
      location.replace("/" + location.hash);  // the dashboard now, as the token's user
      return;
    }
    let msg = r ? `${r.status} ${r.statusText}` : "cannot reach the server";
    try { msg = (await r.json()).error || msg; } catch (e) { /* not JSON */ }
    error.textContent = `Not signed in: ${msg}`;
    error.hidden = false;
    field.focus();
  });
})();
