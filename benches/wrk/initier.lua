-- wrk script: POST /v1/paiement/initier as one merchant (key in the environment variable CAISSE_KEY).
--
-- The body has no `reference`: the field is optional and the server then makes a unique one, while a
-- reference given by the client must be unique per merchant (a repeat is 409 duplicate_reference). So
-- every request creates a new payment, which then runs its sandbox life in the background. No
-- Idempotency-Key either, for the same reason. Used by run.sh.
local key = os.getenv("CAISSE_KEY")
if key == nil or key == "" then
  error("CAISSE_KEY is not set")
end
wrk.method = "POST"
wrk.headers["Authorization"] = "Bearer " .. key
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"montant":10000,"devise":"XOF","fournisseur":"mtn_momo","client_telephone":"+22997000055"}'
