-- The control CA (issue 9): signs the hub's server certificate and every node's
-- client certificate for mTLS on the control stream. One per store; agents never
-- reach the store, so its key stays with the control plane.
CREATE TABLE control_ca (
    singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    cert_pem TEXT NOT NULL,
    key_pem TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
