"""The report page's stylesheet (inline: the page fetches nothing)."""

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#1d2330;
  background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:14px 24px}
header h1{margin:0;font-size:20px}
header p{margin:4px 0 0;color:#c9cfdb}
main{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:16px;
  padding:16px 24px}
section{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:12px 16px;
  overflow-x:auto}
section#summary,section#candidates,section#cases,section#diff,section#artifacts{grid-column:1/-1}
h2{font-size:16px;margin:0 0 6px}
h3{font-size:14px;margin:10px 0 4px}
.caption{color:#5b6475;margin:0 0 8px;font-size:12px}
table{border-collapse:collapse;margin:4px 12px 8px 0;display:inline-table;vertical-align:top}
th,td{border-bottom:1px solid #eceef2;padding:3px 8px;text-align:left;font-size:13px}
.num{text-align:right;font-variant-numeric:tabular-nums}
tr.total td{font-weight:600}
code{font:12px ui-monospace,Menlo,monospace}
svg{display:block;max-width:100%;height:auto;margin:4px 0}
.axis{stroke:#5b6475}
.grid{stroke:#eceef2}
.tick,.label{font-size:10px;fill:#5b6475}
.axis-label{font-size:11px;fill:#1d2330}
.band{fill:#3b6fd8;opacity:.16}
.best{fill:none;stroke:#3b6fd8;stroke-width:2}
.best-dot{fill:#3b6fd8}
.zero{stroke:#9aa3b2;stroke-dasharray:2 3}
.accept-line{stroke:#1f8a4c;stroke-dasharray:6 3}
.err{stroke-width:2}
.mark{stroke:#fff;stroke-width:1}
.accept{stroke:#1f8a4c;fill:#1f8a4c}
.reject{stroke:#c8412f;fill:#c8412f}
.indecisive{stroke:#d19a00;fill:#d19a00}
.gated_out{stroke:#8a93a3;fill:#8a93a3}
.edge{stroke:#b5bcc8;fill:none;stroke-width:1}
.edge.path{stroke:#1f8a4c;stroke-width:3}
.node.seed{fill:#1d2330}
.node.on-path{stroke:#1d2330;stroke-width:2}
.funnel-0{fill:#8a93a3}
.funnel-1{fill:#6d8fd6}
.funnel-2{fill:#3b6fd8}
.funnel-3{fill:#1f8a4c}
.cell.solid{fill:#1f8a4c}
.cell.always_failing{fill:#c8412f}
.cell.flaky{fill:#d19a00}
.cell.infra_errored{fill:#8a93a3}
.role-total{fill:none;stroke:#8a93a3;stroke-width:1.5;stroke-dasharray:4 2}
.role-optimizer{fill:none;stroke:#8e44ad;stroke-width:2}
.role-replay{fill:none;stroke:#3b6fd8;stroke-width:2}
.role-judge{fill:none;stroke:#d35400;stroke-width:2}
.ceiling{stroke:#c8412f;stroke-dasharray:6 3}
.key{display:inline-block;margin-right:12px;padding-left:14px;position:relative;font-size:12px;
  background:none!important}
.key:before{content:'';position:absolute;left:0;top:4px;width:10px;height:10px;border-radius:50%;
  background:currentColor}
.key.accept{color:#1f8a4c}
.key.reject{color:#c8412f}
.key.indecisive{color:#d19a00}
.key.gated_out{color:#8a93a3}
table.candidates td.outcome{font-weight:600}
tr.accept td.outcome{color:#1f8a4c}
tr.reject td.outcome{color:#c8412f}
tr.indecisive td.outcome{color:#d19a00}
tr.gated_out td.outcome{color:#8a93a3}
table.candidates tr{stroke:none;fill:none}
tr.up td{color:#1f8a4c}
tr.down td{color:#c8412f}
pre.diff{background:#fbfbfc;border:1px solid #eceef2;padding:8px;overflow-x:auto;
  font:12px/1.4 ui-monospace,Menlo,monospace;max-height:520px}
pre.diff .add{color:#1f8a4c}
pre.diff .del{color:#c8412f}
pre.diff .hunk{color:#3b6fd8}
.legend .rule{font-size:12px;color:#5b6475;margin-left:6px}
footer{padding:0 24px 16px;color:#5b6475;font-size:12px}
"""
