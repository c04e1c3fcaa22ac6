/**
 * Who may use which content: the one authorisation check for every way of
 * naming content (an image name, an image digest, an environment, a layer
 * digest) in every slot that takes one (image, workspaces, toolkits, FnCall
 * pool layers).
 *
 * The unit of publication is an image: a node image (imported or built, not
 * made by pack) is usable by every account; an environment (made by pack) by
 * its owner, by admins, and by everyone once published. A reference is
 * resolved first, exactly as a sandbox would get it, and then checked against
 * every image it can stand for:
 *
 * - a name denotes one image;
 * - a digest denotes every image with that image digest (same layers, so the
 *   same content: any one usable image is enough);
 * - a digest that is no image's digest is a bare layer. Publishing an image
 *   grants its whole stack, not its parts: a lower layer can hold files that an
 *   upper layer of the published stack deletes or replaces, so a bare layer is
 *   usable only when it is a layer of a node image, of one of the account's own
 *   environments (builders), or by admins.
 *
 * Refusals by name are 403 FORBIDDEN (names are known to their users); a
 * refused digest answers exactly like a digest that does not exist, so a
 * digest is no oracle for content an account may not see. Listings use the
 * same predicate, so an account sees only images and environments it can use.
 */
import { WarrenError } from '../errors';
import type { EnvironmentInfo, ImageInfo } from './types';
import type { LayerStore } from './layers/store';
import { parseRef } from './layers/refs';

/** The account asking, and how far it may use environments that are not published. */
export interface Principal {
  account: string;
  /** "all": admins; "own": its own unpublished environments (builders); "none": published only. */
  unpublished: 'all' | 'own' | 'none';
}

export type ContentSlot = 'image' | 'workspace' | 'toolkit';

/** The environment records the check needs (lifecycle/pack.ts's EnvironmentRegistry). */
export interface EnvironmentLookup {
  get(name: string): { name: string; owner: string; published: boolean; diffLayers: string[]; baseLayers: string[] } | null;
  list(): Array<{ name: string; owner: string; published: boolean; diffLayers: string[]; baseLayers: string[] }>;
}

export class ContentAccess {
  constructor(
    private readonly layers: LayerStore,
    private readonly envs: EnvironmentLookup,
  ) {}

  /** May `p` see and use this environment? */
  environmentVisible(p: Principal, env: Pick<EnvironmentInfo, 'owner' | 'published'>): boolean {
    return env.published || p.unpublished === 'all' || (p.unpublished === 'own' && env.owner === p.account);
  }

  /** May `p` use the image registered under `name`? Node images: everyone. */
  imageUsable(p: Principal, name: string): boolean {
    const env = this.envs.get(name);
    return env === null || this.environmentVisible(p, env);
  }

  private bareLayerUsable(p: Principal, digest: string): boolean {
    if (p.unpublished === 'all') return true;
    if (this.layers.imageNamesWithLayer(digest).some((n) => this.envs.get(n) === null)) return true;
    return p.unpublished === 'own' && this.envs.list().some((e) => e.owner === p.account && (e.diffLayers.includes(digest) || e.baseLayers.includes(digest)));
  }

  /**
   * Resolve `ref` for `slot` as a sandbox would get it, then refuse it unless
   * `p` may use it. Returns the layer digests, top-most first.
   */
  resolve(p: Principal, ref: string, slot: ContentSlot): { digests: string[]; name: string } {
    const resolved =
      slot === 'image'
        ? (() => {
            const img = this.layers.resolveImage(ref);
            return { digests: img.layers, name: img.name };
          })()
        : (() => {
            const l = this.layers.resolveLayer(ref, slot);
            return { digests: [l.digest], name: l.name ?? l.digest };
          })();
    if (p.unpublished === 'all') return resolved;
    const r = parseRef(ref);
    if (r.type === 'name') {
      if (this.imageUsable(p, resolved.name)) return resolved;
      throw new WarrenError('FORBIDDEN', `environment ${JSON.stringify(resolved.name)} is not published; this account may only create sandboxes from published environments`, {
        image: resolved.name,
      });
    }
    const names = this.layers.imageNamesWithDigest(r.digest);
    if (names.length > 0 ? names.some((n) => this.imageUsable(p, n)) : this.bareLayerUsable(p, r.digest)) return resolved;
    // Exactly the answer for a digest that is not there.
    if (slot === 'image') throw new WarrenError('IMAGE_NOT_FOUND', `image ${ref} not found`, { ref });
    throw new WarrenError('LAYER_NOT_FOUND', `${slot} ${ref} not found`, { ref });
  }

  /** Check a whole request's references (image, workspaces, toolkits) at once. */
  check(p: Principal, refs: { image?: string; workspaces?: readonly string[]; toolkits?: readonly string[] }): void {
    if (refs.image !== undefined) this.resolve(p, refs.image, 'image');
    for (const w of refs.workspaces ?? []) this.resolve(p, w, 'workspace');
    for (const k of refs.toolkits ?? []) this.resolve(p, k, 'toolkit');
  }

  images(p: Principal, all: ImageInfo[]): ImageInfo[] {
    return p.unpublished === 'all' ? all : all.filter((i) => this.imageUsable(p, i.name));
  }

  environments(p: Principal, all: EnvironmentInfo[]): EnvironmentInfo[] {
    return all.filter((e) => this.environmentVisible(p, e));
  }
}
