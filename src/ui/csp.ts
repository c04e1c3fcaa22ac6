/**
 * The page's Content-Security-Policy allows <style> elements only with the
 * per-page nonce (no 'unsafe-inline'). xterm.js creates style elements at run
 * time; stamping the nonce on every one at creation (before insertion, when
 * the browser checks it) lets them apply. Imported first by main.ts.
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
