// The API's docs page (/api/v1/docs): Swagger UI over det's OpenAPI document, from det serve's
// own files (the fastapi-offline package's copy of Swagger UI, /static/swagger-ui): nothing
// from another host, and no inline script, which det's Content-Security-Policy forbids.
"use strict";

window.ui = SwaggerUIBundle({
  url: "/api/v1/openapi.json",
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  // "Try it out" as the logged-in WebUI user: det serve refuses a cookie-authenticated change
  // without this header (CSRF; det.api.perimeter).
  requestInterceptor: (req) => { req.headers["X-Det-Request"] = "1"; return req; },
});
