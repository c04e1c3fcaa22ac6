/**
 * The page's Content-Security-Policy allows <style> elements only with the
 * per-page nonce and no style attributes (no 'unsafe-inline'). xterm.js does
 * both at run time: it creates style elements, and its DOM renderer sets
 * `style` attributes on cells (selection colours). Here, before anything
 * else runs (main.ts imports this first):
 * - every <style> element gets the nonce when it is created (before
 *   insertion, when the browser checks it);
 * - setAttribute('style', ...) from the page's own scripts goes through the
 *   CSSOM (element.style.cssText), which the CSP does not restrict. Markup is
 *   never parsed from data (src/ui/dom.ts), so style attributes in markup
 *   stay refused by the policy.
 */
const script = (document.currentScript as HTMLScriptElement | null) ?? document.querySelector<HTMLScriptElement>('script[nonce]');
export const pageNonce = script?.nonce ?? '';

if (pageNonce !== '') {
  const create = Document.prototype.createElement;
  Document.prototype.createElement = function (this: Document, tag: string, options?: ElementCreationOptions) {
    const el = create.call(this, tag, options);
    if (tag.toLowerCase() === 'style') el.setAttribute('nonce', pageNonce);
    return el;
  } as typeof Document.prototype.createElement;
}

const setAttribute = Element.prototype.setAttribute;
Element.prototype.setAttribute = function (this: Element, name: string, value: string): void {
  if (name.toLowerCase() === 'style' && (this instanceof HTMLElement || this instanceof SVGElement)) {
    this.style.cssText = value;
    return;
  }
  setAttribute.call(this, name, value);
};
