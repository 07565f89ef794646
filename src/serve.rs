//! Azure Functions custom handler mode (`aqw serve`).
