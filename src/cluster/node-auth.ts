/**
 * A node's authentication in a cluster: its own tokens (the node's admin
 * token, for the operator), plus account assertions signed by a gateway with
 * the cluster credential. Accounts live in etcd and are checked by the
 * gateway; the node trusts the signed assertion for the length of a request.
 */
import { Auth, type Account } from '../gateway/auth';
import type { Database } from '../state/db';
import { ASSERTION_PREFIX, type ClusterCredential } from './credential';

export class ClusterNodeAuth extends Auth {
  constructor(
    db: Database,
    private readonly credential: ClusterCredential,
  ) {
    super(db);
  }

  override authenticate(token: string | undefined | null): Account | null {
    if (typeof token === 'string' && token.startsWith(ASSERTION_PREFIX)) return this.credential.checkAssertion(token);
    return super.authenticate(token);
  }
}
