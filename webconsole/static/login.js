// Log in with JSON so a wrong password shows a message instead of an error page.
document.getElementById("login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const err = document.getElementById("login-error");
  err.hidden = true;
  const resp = await fetch("/login", {
    method: "POST", headers: {"Content-Type": "application/json", "X-Tandem-Console": "1"},
    credentials: "same-origin",
    body: JSON.stringify({user: document.getElementById("user").value,
                          password: document.getElementById("password").value}),
  });
  if (resp.ok) { window.location = "/"; return; }
  const body = await resp.json().catch(() => ({message: resp.statusText}));
  err.textContent = body.message || "login failed";
  err.hidden = false;
});
