"""The admission webhook: AdmissionReview wire format, decisions, responses, handlers and the app."""
