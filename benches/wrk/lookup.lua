-- wrk script: GET /v1/paiement/{reference} of one existing payment, as its merchant (key in CAISSE_KEY;
-- the reference is in the URL given to wrk). Used by run.sh.
local key = os.getenv("CAISSE_KEY")
if key == nil or key == "" then
  error("CAISSE_KEY is not set")
end
wrk.method = "GET"
wrk.headers["Authorization"] = "Bearer " .. key
